// ucx's control messages: goodbye, abort (with the reason) and its answer, as tagged messages with the control bit.
#pragma once

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../detail/failure.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_engine::on_control_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* self = static_cast<ucx_engine*>(user_data);
  self->control_request = nullptr;
  ucp_request_free(request);
  if (status != UCS_OK) return;  // cancelled at shutdown
  self->control_arrived = true;
  self->control_length = info->length;
}

GRADWIRE_DECL void ucx_engine::post_control_receive() {
  control_buffer.resize(max_control_bytes);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &ucx_engine::on_control_done;
  p.user_data = this;
  const ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), control_buffer.data(), control_buffer.size(),
                                              ucx_tag::control_bit, ucx_tag::control_bit, &p);
  if (UCS_PTR_IS_ERR(r)) ucx_check(UCS_PTR_STATUS(r), "ucp_tag_recv_nbx (control)");
  control_request = r;
}

GRADWIRE_DECL void ucx_engine::on_control() {
  // Payload: u32 sender, u32 kind, u32 cause (errc), u32 1 + the rank whose loss made the
  // sender fail (0: none), then the reason as text.
  if (control_length < control_header_bytes) return post_control_receive();
  std::uint32_t header[4];
  std::memcpy(header, control_buffer.data(), sizeof header);
  const int peer = static_cast<int>(header[0]);
  const auto kind = static_cast<ucx_control>(header[1]);
  const auto cause = static_cast<errc>(header[2]);
  // 1 + the rank whose loss made the sender fail: a rank of the job other than the sender.
  const int lost_rank = header[3] >= 1 && header[3] <= static_cast<std::uint32_t>(options.size) && header[3] - 1 != header[0]
                            ? static_cast<int>(header[3]) - 1
                            : -1;
  const std::string reason(reinterpret_cast<const char*>(control_buffer.data()) + sizeof header,
                           control_length - sizeof header);
  post_control_receive();
  if (peer < 0 || peer >= options.size) return;
  if (kind == ucx_control::goodbye) return on_goodbye(peer);
  if (kind == ucx_control::rejoin)
    return take_back(peer, std::as_bytes(std::span(reason.data(), reason.size())));  // its address (a copy)
  if (kind == ucx_control::rejoin_welcome || kind == ucx_control::rejoin_refused) {
    if (!rejoining) return;  // an answer that came after this replacement stopped waiting
    peers[peer].rejoin_answer =
        kind == ucx_control::rejoin_welcome ? ucx_peer::answer::welcome : ucx_peer::answer::refused;
    peers[peer].refusal = reason;
    peers[peer].refusal_retryable = kind == ucx_control::rejoin_refused && cause == errc::timeout;
    return;
  }
  if (kind == ucx_control::abort_seen) {
    peers[peer].saw_our_abort = true;
    return;
  }
  if (kind == ucx_control::abort) {
    // Answered before anything here closes an endpoint (see ucx_control).
    send_control(ucx_control::abort_seen, errc{}, {}, clock::now() + std::chrono::milliseconds(200), peer);
    const abort_notice notice{cause, lost_rank, reason};
    const bool tolerates_lost = lost_rank >= 0 && peers[lost_rank].state.tolerated;
    const peer_failure_outcome f =  // every transport's rule
        peer_failure(options.rank, peer, notice, peers[peer].state.tolerated, tolerates_lost);
    if (f.isolate_only) return isolate(peer, f.report.reason, true);  // it aborts: it is going down
    if (aborting) return;  // abort_all fails this rank with its own reason
    // A loss this rank has seen itself, and waits out the grace of, is reported as it saw it.
    if (lost_rank >= 0 && peers[lost_rank].state.suspected()) return fail_from_loss(lost_rank);
    fail_everything(f.report.cause, f.report.reason);
  }
}

GRADWIRE_DECL void ucx_engine::on_goodbye(int peer) {
  auto& p = peers[peer];
  p.state.say_goodbye();
  // It flushed everything it sent before saying goodbye, so its messages are here or
  // being received (a rendezvous in progress cannot be told from a receive that
  // waits in vain): receives from it still open a moment from now never complete.
  p.drained_at = clock::now() + std::chrono::seconds(1);
}

GRADWIRE_DECL void ucx_engine::fail_receives_from(int peer) {
  for (auto* op : std::vector<ucx_op*>(in_flight))
    if (!op->is_send && op->peer == peer && op->state == status::active)
      withdraw(*op, errc::peer_lost, finished_message(options.rank, peer));
}

// A peer that control messages can still reach: connected, not lost, not finished.
GRADWIRE_DECL bool ucx_engine::listening(int r) const {
  const auto& p = peers[r];
  return r != options.rank && p.ep && p.state.live();
}

// Sends one control message to every live peer (or only to `only`) and waits, until
// `until`, for the sends to complete and reach the peers.
GRADWIRE_DECL void ucx_engine::send_control(ucx_control kind, errc cause, const std::string& text, deadline until, int only,
                                            int lost_rank) {
  std::vector<ucx_op> sends(peers.size());
  const std::uint32_t header[4] = {static_cast<std::uint32_t>(options.rank), static_cast<std::uint32_t>(kind),
                                   static_cast<std::uint32_t>(cause), static_cast<std::uint32_t>(lost_rank + 1)};
  std::vector<std::byte> payload(sizeof header + text.size());
  std::memcpy(payload.data(), header, sizeof header);
  std::memcpy(payload.data() + sizeof header, text.data(), text.size());
  for (int r = 0; r < options.size; ++r) {
    auto& p = peers[r];
    if ((only >= 0 && r != only) || !listening(r)) continue;
    auto& op = sends[r];
    op.is_send = true;
    op.peer = r;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = &ucx_engine::on_send_done;
    prm.user_data = &op;
    const ucs_status_ptr_t s =
        ucp_tag_send_nbx(p.ep, payload.data(), payload.size(), ucx_tag::control(options.rank), &prm);
    if (UCS_PTR_IS_PTR(s)) op.request = s;
  }
  auto all_sent = [&] { return std::none_of(sends.begin(), sends.end(), [](const auto& o) { return o.request != nullptr; }); };
  while (!all_sent() && clock::now() < until)
    if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
  if (!all_sent()) close_endpoints();  // releases what is left, so `sends` may go
  flush(until);
}

// Progresses until every live peer answered this rank's abort, or broke, or `until`.
GRADWIRE_DECL void ucx_engine::await_abort_seen(deadline until) {
  auto answered = [&] {
    if (failed) return true;
    for (int r = 0; r < options.size; ++r) {
      const auto& p = peers[r];
      if (listening(r) && !p.saw_our_abort && !p.state.suspected()) return false;
    }
    return true;
  };
  while (!answered() && clock::now() < until)
    if (progress_once() == 0) std::this_thread::yield();
}

GRADWIRE_DECL void ucx_engine::say_goodbye() {
  if (failed || said_goodbye) return;
  said_goodbye = true;
  // Everything this rank sent arrives before its goodbye (see on_goodbye).
  flush(clock::now() + std::chrono::seconds(2));
  send_control(ucx_control::goodbye, errc{}, {}, clock::now() + std::chrono::seconds(1));
}

GRADWIRE_DECL void ucx_engine::abort_all(errc cause, const std::string& reason) {
  if (failed) return;
  abort_with(cause, reason, -1, rank_failed_message(options.rank, reason));
}

// Tells every live peer why this rank fails (`told`; `lost`: the peer whose loss it is,
// abort_notice::lost), within a second, so they hear it before this rank goes on (and
// perhaps exits); then fails the rank with `report`.
GRADWIRE_DECL void ucx_engine::abort_with(errc cause, const std::string& told, int lost_rank, const std::string& report) {
  const auto until = clock::now() + std::chrono::seconds(1);
  aborting = true;
  send_control(ucx_control::abort, cause, told.substr(0, max_control_bytes - control_header_bytes), until, -1, lost_rank);
  await_abort_seen(until);
  aborting = false;
  fail_everything(cause, report);
}

}  // namespace gradwire::transport::detail
