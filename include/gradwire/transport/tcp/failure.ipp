// asio_tcp's peer loss: a broken connection's grace, isolating a tolerated peer, failing the rank (and telling the peers which).
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
  if (link.state.tolerated) return isolate(link, why, closed);
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
GRADWIRE_DECL void tcp_engine::isolate(tcp_link& link, const std::string& why, bool gone_for_sure) {
  link.alive = false;
  link.state.lose(why);
  lost.push_back(link.peer);
  if (gone_for_sure) gone.push_back(link.peer);
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

}  // namespace gradwire::transport::detail
