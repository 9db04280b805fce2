// asio_tcp's waits: polling before sleeping in epoll, the hooks of the shared wait, and withdrawing an op.
#pragma once

#include <span>
#include <thread>
#include <utility>

#include "../../support/asio.hpp"
#include "../../timeouts.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

// Before a wait sleeps: waiting for one message while an earlier, larger one from the
// same peer waits for its receive would wait forever (its bytes are ahead in the
// stream), so that one is taken into memory now (collectives post receives in order, so
// they never pay this); then a brief poll; then the stall watch learns whom it waits for.
GRADWIRE_DECL tcp_engine::watched_wait tcp_engine::prepare_wait(tcp_op& op) {
  if (!op.is_send && op.state == status::queued && op.peer != options.rank)
    if (auto& link = links[op.peer]; link && link->parked && link->incoming.tag != op.tag) {
      if (link->early_reading) {
        link->evict = true;  // the read-ahead in flight takes it into memory when it lands
      } else {
        link->parked = false;
        read_eager(*link);
      }
    }
  poll_briefly(op);
  if (op.state != status::done) begin_wait(op.peer);  // going to sleep: the stall watch's business
  return watched_wait{*this};
}

// Progress is made by the thread that waits: it runs the rank's io_context.
GRADWIRE_DECL bool tcp_engine::progress(tcp_op& op, deadline until) {
  return support::run_until(io, [&] { return op.state == status::done; }, until);
}

// A peer's answer often comes within microseconds; a sleep in epoll and the wake-up
// after it cost more than that. With a CPU per rank, poll hot for a short window first,
// while the spin gate says it pays (support/waiting.hpp); a closed gate sleeps at once.
// Oversubscribed, yield the CPU between polls instead (the peer may need it), always: a
// window that yields hands the CPU to the peer, which is what an oversubscribed job
// needs (4 ranks on 2 cores: skipping it made 1-64 KiB 1.2x slower).
GRADWIRE_DECL void tcp_engine::poll_briefly(const tcp_op& op) {
  if (options.poll_before_sleep.count() == 0 || op.state == status::done) return;
  if (dedicated && !spin.open()) return;
  const auto stop = clock::now() + support::poll_window(options.poll_before_sleep, dedicated);
  while (op.state != status::done && clock::now() < stop) {
    if (io.stopped()) io.restart();
    if (io.poll() == 0 && !dedicated) std::this_thread::yield();
  }
  if (dedicated) spin.spun(op.state == status::done);
}

// Withdraws an op that will not be waited for. One that Asio is reading into or
// writing from cannot be taken back mid-frame (a stream cut there cannot be
// resynchronised): it is let finish, for up to withdraw_grace, as a wait would (its peer
// is most often withdrawing the other end of it, and finishing it too); past that its
// connection is closed, which loses the peer.
GRADWIRE_DECL void tcp_engine::cancel(tcp_op& op) noexcept {
  if (op.state == status::done || op.state == status::cancelled) return;
  if (op.peer == options.rank) {
    std::erase(self_receives, &op);
  } else if (auto& link = links[op.peer]) {
    auto active = [&] {
      return op.is_send ? (link->writing && !link->sends.empty() && link->sends.front() == &op) : link->reading == &op;
    };
    if (active() && link->alive) {
      try {
        support::run_until(io, [&] { return op.state == status::done; }, clock::now() + withdraw_grace);
      } catch (...) {  // a handler's failure is the link's: the op fails with it below
      }
      if (op.state == status::done) return;
    }
    if (active()) {  // the link is out of step: a tolerated peer is cut off, another fails the rank
      if (op.is_send) link->sends.pop_front(); else link->reading = nullptr;
      if (link->state.tolerated && link->alive) isolate(*link, abandoned_peer_message(options.rank, op.peer));
      else lose(*link, errc::peer_lost, abandoned_message(op.peer));
    } else {
      std::erase(op.is_send ? link->sends : link->receives, &op);
    }
  }
  op.state = status::cancelled;
}

}  // namespace gradwire::transport::detail
