// ucx's peer-loss lifecycle: broken endpoints, isolating a tolerated peer, failing the rank, withdrawing ops.
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Finishes an op that UCX let go of (or never had) with `why`; one that failed in
// UCX's callback without a reason gets this one.
GRADWIRE_DECL void ucx_engine::complete_failure(ucx_op& op, errc cause, const std::string& why) {
  if (op.state == status::active) op.finish(cause, why);
  else if (op.failure != errc{} && op.message.empty()) op.message = why;
}

// Withdraws an op that will not be waited for; returns once UCX no longer touches
// its buffer. A receive is cancelled, but UCX cannot cancel one already matched (a
// rendezvous under way), nor a send: such an op is given a moment to finish, and
// otherwise its peer's endpoint is closed, which releases it. A peer cannot be left with
// half a message: a tolerated one is cut off (lost), another fails the rank.
GRADWIRE_DECL void ucx_engine::cancel(ucx_op& op) noexcept {
  if (op.state == status::cancelled) return;
  if (op.request) {
    if (!op.is_send) ucp_request_cancel(worker.get(), op.request);
    settle(op);
    if (op.request) {
      auto& p = peers[op.peer];
      if (p.state.tolerated && !p.state.lost() && !failed)
        isolate(op.peer, abandoned_peer_message(options.rank, op.peer));
      else
        fail_everything(errc::peer_lost, "rank " + std::to_string(options.rank) + ": " + abandoned_message(op.peer));
      settle(op);
    }
  }
  forget(op);
  op.state = status::cancelled;
}

// Fails an op that UCX may still hold: a receive is cancelled, and both wait until
// UCX lets go of the buffer (a send's endpoint must be closed first to be released).
GRADWIRE_DECL void ucx_engine::withdraw(ucx_op& op, errc cause, const std::string& why) noexcept {
  if (!op.is_send && op.request) ucp_request_cancel(worker.get(), op.request);
  settle(op);
  complete_failure(op, cause, why);
}

GRADWIRE_DECL void ucx_engine::forget(ucx_op& op) noexcept { std::erase(in_flight, &op); }

// Only these: settling a send to a live peer that has not posted its receive would spin
// for settle's 2 s, inside whoever's wait saw the other peer break.
GRADWIRE_DECL std::vector<ucx_op*> ucx_engine::sends_to(int peer) const {
  std::vector<ucx_op*> sends;
  for (auto* op : in_flight)
    if (op->is_send && op->peer == peer) sends.push_back(op);
  return sends;
}

GRADWIRE_DECL void ucx_engine::on_broken(int peer, ucs_status_t s) {
  auto& p = peers[peer];
  if (p.state.lost() || failed) return;
  const std::string reason =
      "its endpoint failed (" + std::string(ucx_status_text(s)) + "; the process exited or was killed)";
  const std::string why = lost_peer_message(options.rank, peer, reason);
  if (p.state.finished) {
    // It said goodbye and left. Sends to it still in flight carried what it wanted
    // (it would not have finished without them); UCX fails them as the endpoint
    // closes, so they are settled first. Receives from it drain (on_goodbye).
    const std::vector<ucx_op*> sends = sends_to(peer);
    for (auto* op : sends)
      if (!op->one_sided) op->finish();
    close_endpoint(p);
    for (auto* op : sends) settle(*op);  // UCX lets go before anyone frees it
    return;
  }
  if (p.state.tolerated) return isolate(peer, why, s == UCS_ERR_CONNECTION_RESET);  // a timeout may be a silence
  // Its goodbye or abort may still be on the way (another lane): give it a moment.
  if (!p.state.suspected()) p.state.suspect(clock::now() + std::chrono::milliseconds(200), reason, why);
}

// The grace is over and no goodbye or reason came: this rank fails from the loss of
// `peer`, and tells the others so first (abort_notice::lost): a peer on shared memory
// notices a killed process only at its next keepalive, and would otherwise see this
// rank's endpoints close first and blame this rank.
GRADWIRE_DECL void ucx_engine::fail_from_loss(int peer) {
  auto& p = peers[peer];
  p.state.suspected_until.reset();
  if (failed || aborting) return;
  p.state.lose(p.state.suspected_message);  // not listening any more: nothing is sent to it
  abort_with(errc::peer_lost, p.state.suspected_reason, peer, p.state.suspected_message);
}

// A peer is gone: its operations fail, the rest of the rank goes on.
GRADWIRE_DECL void ucx_engine::isolate(int peer, const std::string& why, bool gone_for_sure) {
  auto& p = peers[peer];
  if (p.state.lost()) return;
  p.state.lose(why);
  if (!p.state.finished) lost.push_back(peer);
  if (!p.state.finished && gone_for_sure) gone.push_back(peer);
  close_endpoint(p);  // first: releases the sends to it
  for (auto* op : std::vector<ucx_op*>(in_flight))
    if (op->peer == peer) withdraw(*op, errc::peer_lost, why);
}

GRADWIRE_DECL void ucx_engine::fail_everything(errc cause, const std::string& why) {
  if (failed) return;
  failed.emplace(cause, why);
  close_endpoints();  // first: releases the sends still in UCX
  for (auto* op : std::vector<ucx_op*>(in_flight)) withdraw(*op, cause, why);
}

GRADWIRE_DECL std::string ucx_engine::why_failed(const ucx_op& op) const {
  if (failed) return failed->second;
  const auto& p = peers[op.peer];
  if (p.state.lost()) return p.state.lost_reason;
  return "rank " + std::to_string(options.rank) + ": " + describe(op) + " failed";
}

}  // namespace gradwire::transport::detail
