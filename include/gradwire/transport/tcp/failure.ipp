// asio_tcp's peer-loss lifecycle: broken connections, abort and goodbye frames, isolating a tolerated peer, failing the rank.
#pragma once

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <span>
#include <string>
#include <vector>

#include "../../support/asio.hpp"
#include "../detail/failure.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::tolerate(int peer) {
  if (auto& link = links[peer]) link->state.tolerated = true;
}

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
  if (link.state.tolerated)
    return isolate(link, tolerated_peer_failed_message(options.rank, link.peer, abort_reason(link.peer, notice)));
  // A loss this rank has seen itself, and waits out the grace of (await_loss_reason), is
  // reported as it saw it.
  if (notice.lost >= 0 && loss_grace && notice.lost == loss_peer) return fail_from_loss();
  const bool tolerates_lost = notice.lost >= 0 && links[notice.lost] && links[notice.lost]->state.tolerated;
  const peer_failure_outcome f = peer_failure(options.rank, link.peer, notice, tolerates_lost);
  // Passed on before this rank's connections close, so that a peer which sees one of them
  // close reads why on that same stream first, instead of racing the first rank's abort
  // (which may come later, or never: it goes out only on idle links).
  if (!failed && !aborting) send_abort(f.pass_on.cause, f.pass_on.reason, f.pass_on.lost);
  fail_everything(f.report.cause, f.report.reason);
}

GRADWIRE_DECL void tcp_engine::broken(tcp_link& link, const boost::system::error_code& ec) {
  if (!link.alive || ec == boost::asio::error::operation_aborted) return;
  if (link.state.finished) {  // it said goodbye and left: only what was still meant for it fails
    link.alive = false;
    for (auto* op : link.sends) op->finish(errc::peer_lost, finished_message(options.rank, link.peer));
    link.sends.clear();
    return;
  }
  const bool closed = ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset ||
                      ec == boost::asio::error::broken_pipe;
  link.alive = false;
  // The kernel's keepalive gave up (no answer to its probes): a partition or a dead host.
  const bool silent = ec == boost::asio::error::timed_out;
  const std::string reason = silent   ? heartbeat_loss_reason(heartbeat_limit(), true)
                             : closed ? "its connection closed (the process exited or was killed)"
                                      : "connection error: " + ec.message();
  std::string why = silent ? lost_message({{link.peer, heartbeat_limit()}}, true)
                           : lost_peer_message(options.rank, link.peer, reason);
  if (link.state.tolerated) return isolate(link, why);
  // A rank that failed for a reason sends abort frames before it exits, but they may
  // arrive on other connections after this one closed: give them a moment, so the
  // rank reports the root cause rather than the echo.
  if (!loss_grace) {
    loss_grace.emplace(io);
    loss_peer = link.peer;
    link.state.suspect(clock::now() + std::chrono::milliseconds(200), reason, std::move(why));
    await_loss_reason(0);
  }
}

// The moment of broken(): 200 ms, then 10 ms more at a time (at most 50 times) while bytes
// that arrived on a live connection are still unread (and will be read: not behind a
// parked message). Under load the waiting thread may run only after the moment has
// passed, with an abort frame already in a socket's buffer: the frame is read first (its
// handlers run before the timer's next expiry), so the rank reports that reason, not the
// bare closed connection, however late its thread ran.
GRADWIRE_DECL void tcp_engine::await_loss_reason(int extensions) {
  loss_grace->expires_after(extensions == 0 ? std::chrono::milliseconds(200) : std::chrono::milliseconds(10));
  loss_grace->async_wait([this, extensions](const boost::system::error_code& ec) {
    if (!ec && !failed && extensions < 50 && std::any_of(links.begin(), links.end(), [](const auto& l) {
          boost::system::error_code ignored;
          return l && l->alive && !l->parked && l->socket.available(ignored) > 0;  // parked: nothing is read
        }))
      return await_loss_reason(extensions + 1);
    fail_from_loss();
  });
}

// The grace is over and no reason came: this rank fails from the loss of loss_peer, and
// tells the others so (abort_notice::lost), before its connections close.
GRADWIRE_DECL void tcp_engine::fail_from_loss() {
  if (failed || aborting) return;
  const peer_state& s = links[loss_peer]->state;
  send_abort(errc::peer_lost, s.suspected_reason, loss_peer);
  fail_everything(errc::peer_lost, s.suspected_message);
}

// A tolerated peer is gone: its operations fail, the rest of the rank goes on.
GRADWIRE_DECL void tcp_engine::isolate(tcp_link& link, const std::string& why) {
  link.alive = false;
  link.state.lose(why);
  lost.push_back(link.peer);
  boost::system::error_code ignored;
  link.socket.close(ignored);  // after this, Asio touches none of this link's buffers
  fail_operations(link, errc::peer_lost, why);
  link.writing = false;
  link.parked = false;
  link.early_filled = 0;
  link.evict = false;
}

// Finishes every operation queued on or in flight over `link` with `cause`.
GRADWIRE_DECL void tcp_engine::fail_operations(tcp_link& link, errc cause, const std::string& why) {
  for (auto* op : link.sends) op->finish(cause, why);
  for (auto* op : link.receives) op->finish(cause, why);
  if (link.reading) link.reading->finish(cause, why);
  link.sends.clear();
  link.receives.clear();
  link.reading = nullptr;
}

// A broken connection fails the whole rank: collectives cannot complete without
// every peer, and failing at once beats waiting for every deadline.
GRADWIRE_DECL void tcp_engine::lose(tcp_link& link, errc cause, const std::string& why) {
  const std::string what = "rank " + std::to_string(options.rank) + ": " + why;
  // So the peers report this, not a closed connection: the one that sent a bad frame too
  // (a corrupt payload, another job's token), whose link is still open until now.
  if (!failed) send_abort(cause, what);
  link.alive = false;
  fail_everything(cause, what);
}

GRADWIRE_DECL void tcp_engine::fail_everything(errc cause, const std::string& why) {
  if (failed || aborting) return;
  failed.emplace(cause, why);
  for (auto& l : links) {
    if (!l) continue;
    boost::system::error_code ignored;
    l->socket.close(ignored);  // after this, Asio touches no buffer of ours again
    fail_operations(*l, cause, why);
    l->alive = false;
  }
  for (auto* op : self_receives) op->finish(cause, why);
  self_receives.clear();
}

GRADWIRE_DECL void tcp_engine::abort_all(errc cause, const std::string& reason) {
  if (failed) return;
  // Let writes in flight finish (briefly), so the abort frame can follow them; the
  // rank is failing anyway, so nothing that happens meanwhile may close sockets yet.
  aborting = true;
  support::run_until(
      io, [&] { return std::none_of(links.begin(), links.end(), [](const auto& l) { return l && l->alive && l->writing; }); },
      deadline_after(std::chrono::milliseconds(200)));
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

}  // namespace gradwire::transport::detail
