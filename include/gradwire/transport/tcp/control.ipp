// asio_tcp's control frames: goodbye, abort (with the reason, and the lost rank it relays) and status (what a waiting
// rank waits for).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "../../observe/activity.hpp"
#include "../../support/asio.hpp"
#include "../detail/failure.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

// The peer finished in good order: what it sent has arrived; what it did not send
// never will. Receives that nothing arrived for fail, now and later; the rest of
// the job goes on (it may not need this peer any more).
GRADWIRE_DECL void tcp_engine::on_goodbye(tcp_link& link) {
  link.state.say_goodbye();
  const std::string why = finished_message(options.rank, link.peer);
  for (auto* op : link.receives) op->finish(errc::peer_lost, why);
  link.receives.clear();
}

GRADWIRE_DECL void tcp_engine::say_goodbye() {
  if (failed) return;
  wire::frame_header h;
  h.kind = wire::frame_kind::goodbye;
  h.token_hash = token;
  h.source = static_cast<std::uint32_t>(options.rank);
  send_to_all_now(h, {});
}

// Writes one control frame on every idle connection without waiting and without
// running any handler (a handler could fail the rank and close sockets midway): a
// short frame fits an idle socket's buffer, and one that does not is skipped (that
// peer then sees the connection close instead).
GRADWIRE_DECL void tcp_engine::send_to_all_now(const wire::frame_header& h, std::span<const std::byte> payload) {
  const wire::header_bytes header = wire::encode(h);
  std::vector<std::byte> frame(header.begin(), header.end());
  frame.insert(frame.end(), payload.begin(), payload.end());
  for (auto& l : links)
    if (l && l->alive && !l->writing) {
      boost::system::error_code ec;
      l->socket.non_blocking(true, ec);
      std::size_t written = 0;
      while (!ec && written < frame.size())
        written += l->socket.write_some(boost::asio::buffer(frame.data() + written, frame.size() - written), ec);
    }
}

GRADWIRE_DECL void tcp_engine::on_abort(tcp_link& link, const std::string& reason) {
  // tag: the cause (errc) in the low 32 bits, 1 + the rank whose loss made the peer fail above.
  const auto relayed = static_cast<std::int64_t>(link.incoming.tag >> 32) - 1;
  const abort_notice notice{static_cast<errc>(link.incoming.tag & 0xffffffffu),
                            relayed >= 0 && relayed < options.size && relayed != link.peer ? static_cast<int>(relayed) : -1,
                            reason};
  const bool tolerates_lost = notice.lost >= 0 && links[notice.lost] && links[notice.lost]->state.tolerated;
  const peer_failure_outcome f = peer_failure(options.rank, link.peer, notice, link.state.tolerated, tolerates_lost);
  if (f.isolate_only) return isolate(link, f.report.reason, true);  // it aborts: it is going down
  // A loss this rank has seen itself, and waits out the grace of (await_loss_reason), is
  // reported as it saw it.
  if (notice.lost >= 0 && links[notice.lost] && links[notice.lost]->state.suspected()) return fail_from_loss();
  // Passed on before this rank's connections close, so that a peer which sees one of them
  // close reads why on that same stream first, instead of racing the first rank's abort
  // (which may come later, or never: it goes out only on idle links).
  if (!failed && !aborting) send_abort(f.pass_on.cause, f.pass_on.reason, f.pass_on.lost);
  fail_everything(f.report.cause, f.report.reason);
}

GRADWIRE_DECL void tcp_engine::abort_all(errc cause, const std::string& reason) {
  if (failed) return;
  // Let writes in flight finish (briefly), so the abort frame can follow them; the
  // rank is failing anyway, so nothing that happens meanwhile may close sockets yet.
  aborting = true;
  support::run_until(
      io, [&] { return std::none_of(links.begin(), links.end(), [](const auto& l) { return l && l->alive && l->writing; }); },
      clock::now() + std::chrono::milliseconds(200));
  aborting = false;
  send_abort(cause, reason);
  fail_everything(cause, rank_failed_message(options.rank, reason));
}

// An abort frame with the reason on every idle connection (see send_to_all_now).
GRADWIRE_DECL void tcp_engine::send_abort(errc cause, const std::string& reason, int lost_rank) {
  wire::frame_header h;
  h.kind = wire::frame_kind::abort;
  h.token_hash = token;
  h.tag = static_cast<std::uint32_t>(cause) | (static_cast<std::uint64_t>(lost_rank + 1) << 32);
  h.source = static_cast<std::uint32_t>(options.rank);
  const std::string text = reason.substr(0, max_abort_bytes);
  h.length = text.size();
  send_to_all_now(h, std::as_bytes(std::span(text.data(), text.size())));
}

// Status frame: tag = operation number; payload = step u64, count u32, the ranks waited
// for (u32 each), then the activity's name. An empty list: no longer waiting.
GRADWIRE_DECL void tcp_engine::send_status(bool still_waiting) {
  const observe::activity& doing = observe::current_activity();
  const std::uint64_t step = observe::current_step().load(std::memory_order_relaxed);
  const std::string_view name = doing.name ? doing.name : "";
  const std::uint32_t count = still_waiting ? static_cast<std::uint32_t>(waiting_for.size()) : 0;
  for (auto& l : links) {
    if (!l || !l->alive || l->state.finished || l->status_out.state != status::done) continue;
    auto& bytes = l->status_bytes;
    bytes.assign(12 + 4 * count + name.size(), std::byte{0});
    wire::detail::put<std::uint64_t>(bytes.data(), step);
    wire::detail::put<std::uint32_t>(bytes.data() + 8, count);
    for (std::uint32_t i = 0; i < count; ++i)
      wire::detail::put<std::uint32_t>(bytes.data() + 12 + 4 * i, static_cast<std::uint32_t>(waiting_for[i]));
    std::memcpy(bytes.data() + 12 + 4 * count, name.data(), name.size());
    wire::frame_header h;
    h.kind = wire::frame_kind::status;
    h.token_hash = token;
    h.tag = doing.operation;
    h.length = bytes.size();
    h.source = static_cast<std::uint32_t>(options.rank);
    tcp_op& op = l->status_out;
    op = tcp_op{};
    op.is_send = true;
    op.peer = l->peer;
    op.data = bytes.data();
    op.bytes = bytes.size();
    op.header = wire::encode(h);
    // Ahead of queued messages (it is about them), behind the one being written.
    l->sends.insert(l->sends.begin() + (l->writing ? 1 : 0), &op);
    if (!l->writing) write_next(*l);
  }
}

// False if the frame did not parse (the rank failed).
GRADWIRE_DECL bool tcp_engine::on_status(tcp_link& link, std::span<const std::byte> payload) {
  const std::string who = "rank " + std::to_string(link.peer);
  auto refuse = [&](const char* what) {
    lose(link, errc::protocol, who + " sent a " + what + " status frame");
    return false;
  };
  if (payload.size() < 12) return refuse("truncated");
  peer_status st;
  st.operation = link.incoming.tag;
  st.step = wire::detail::get<std::uint64_t>(payload.data());
  const auto count = wire::detail::get<std::uint32_t>(payload.data() + 8);
  if (count > links.size() || payload.size() < 12 + 4 * std::size_t{count}) return refuse("malformed");
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto rank = wire::detail::get<std::uint32_t>(payload.data() + 12 + 4 * i);
    if (rank >= links.size()) return refuse("malformed");  // a rank outside the job: stall_report trusts these
    st.waits_for.push_back(static_cast<int>(rank));
  }
  const auto name = payload.subspan(12 + 4 * std::size_t{count});
  st.activity.assign(reinterpret_cast<const char*>(name.data()), name.size());
  link.status = std::move(st);
  return true;
}

}  // namespace gradwire::transport::detail
