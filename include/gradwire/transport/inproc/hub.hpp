// The in-process group's shared state: every rank's posted operations, matched and moved in one pass, and the group's failure mark.
//
// A send and a receive with the same (source, destination, tag) are matched in the
// order they were posted. The bytes then move in one pass straight from the sender's
// buffer into the receiver's (copied, or added for async_recv_accumulate), nothing is
// allocated per byte, and the pass is made by whichever of the two ranks claims it
// first: the receiver when it posts second, otherwise whichever side waits first. In a
// ring every rank thus moves its own incoming message, in parallel with the others.
// How a rank waits meanwhile: wait_policy.hpp.
//
// If a rank fails (fail(); inproc_group::run calls it for a rank that threw), every other
// rank's pending and future operations fail naming it, rather than waiting for their
// deadlines: with peer_lost, or with its own kind for a mismatch, timeout or config error
// (detail::peer_failure_kind, every transport's rule).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../clock.hpp"
#include "../../error.hpp"
#include "../../support/topology.hpp"
#include "../../support/waiting.hpp"
#include "../detail/deliver.hpp"
#include "../detail/failure.hpp"
#include "../detail/messages.hpp"
#include "wait_policy.hpp"

namespace gradwire::transport::detail {

struct inproc_op {
  // posted: queued, unmatched; ready: matched, bytes not moved yet; moving: one side is
  // moving them; done: finished (failure says how); cancelled: withdrawn unmatched.
  enum class status : std::uint8_t { posted, ready, moving, done, cancelled };
  bool is_send = false;
  int source = 0, destination = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;  // the sender's bytes are never written through this
  std::size_t bytes = 0;
  deliver_fn deliver = deliver_copy;  // used on the receiving side
  std::atomic<status> state{status::posted};  // written under the hub's mutex; read by spinning waiters
  inproc_op* partner = nullptr;               // set while ready or moving
  errc failure{};
  std::string failure_message;

  int owner() const noexcept { return is_send ? source : destination; }
  status now() const noexcept { return state.load(std::memory_order_acquire); }
};

inline std::string describe(const inproc_op& op) {
  return describe_operation(op.is_send, op.is_send ? op.destination : op.source, op.tag, op.bytes);
}

class inproc_hub {
  using status = inproc_op::status;

 public:
  inproc_hub(int size, cluster::topology topology, inproc_wait_policy wait_policy)
      : size_(size),
        topology_(std::move(topology)),
        wait_policy_(wait_policy),
        yield_state_(std::make_unique<yield_state[]>(static_cast<std::size_t>(size))),
        wakeups_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(size))),
        sends_(static_cast<std::size_t>(size) * size),
        receives_(static_cast<std::size_t>(size) * size) {}

  int size() const noexcept { return size_; }
  const cluster::topology& topology() const noexcept { return topology_; }
  const inproc_wait_policy& wait_policy() const noexcept { return wait_policy_; }

  void post(inproc_op& op) {
    std::unique_lock lock(mutex_);
    throw_if_failed(op.owner(), op);
    auto& others = queue(op, /*mine=*/false);
    auto match = std::find_if(others.begin(), others.end(), [&](inproc_op* o) { return o->tag == op.tag; });
    if (match == others.end()) {
      queue(op, /*mine=*/true).push_back(&op);
      return;
    }
    inproc_op& other = **match;
    others.erase(match);
    op.partner = &other;
    other.partner = &op;
    if (op.is_send) {  // the receiver is waiting or will wait: let either side move the bytes
      set_state(op, other, status::ready);
      wakeups_[other.owner()].notify_all();
      return;
    }
    move_bytes(lock, op);  // a receive posted second moves the bytes at once
  }

  void wait(inproc_op& op, deadline until) {
    poll_while_pending(op, until);
    std::unique_lock lock(mutex_);
    auto& wakeup = wakeups_[op.owner()];
    for (;;) {
      const status s = op.now();
      if (s == status::done) break;
      if (s == status::cancelled)
        throw error(errc::invalid_argument, "rank " + std::to_string(op.owner()) + ": " + describe(op) +
                                                " was withdrawn (it timed out or was cancelled): post it again");
      if (s == status::ready) {
        move_bytes(lock, op);
      } else if (s == status::moving) {  // the other side is moving the bytes: a bounded wait
        wakeup.wait(lock, [&] { return op.now() == status::done; });
      } else {  // posted
        if (failed_rank_ >= 0) {
          unpost(op);
          throw_if_failed(op.owner(), op);
        }
        if (wakeup.wait_until(lock, until) == std::cv_status::timeout && op.now() == status::posted) {
          unpost(op);
          throw error(errc::timeout, timeout_message(op.owner(), describe(op)));
        }
      }
    }
    if (op.failure != errc{}) throw error(op.failure, "rank " + std::to_string(op.owner()) + ": " + op.failure_message);
  }

  // Waits until one of `count` ops (op_at(i); nullptr entries skipped) is matched or
  // finished, so that wait() on it completes without waiting for a peer; returns its index.
  template <class OpAt>
  std::size_t wait_any(std::size_t count, OpAt&& op_at, int me, deadline until) {
    auto find = [&]() -> std::optional<std::size_t> {
      for (std::size_t i = 0; i < count; ++i)
        if (const inproc_op* op = op_at(i); op && op->now() != status::posted) return i;
      return std::nullopt;
    };
    std::unique_lock lock(mutex_);
    for (;;) {
      if (auto i = find()) return *i;
      if (failed_rank_ >= 0)
        throw error(failure_cause_, peer_failed_message(me, failed_rank_, failure_reason_));
      if (wakeups_[me].wait_until(lock, until) == std::cv_status::timeout && !find())
        throw error(errc::timeout, wait_any_timeout_message(me, count));
    }
  }

  // Withdraws an operation that will not be waited for, so its buffer may be freed:
  // unmatched, it leaves its queue; matched but not moved, its partner goes back to the
  // front of its queue as if this one had never been posted; while bytes are moving,
  // it waits for them (a bounded wait).
  void cancel(inproc_op& op) noexcept {
    std::unique_lock lock(mutex_);
    switch (op.now()) {
      case status::posted:
        unpost(op);
        break;
      case status::ready: {
        inproc_op& partner = *op.partner;
        partner.partner = op.partner = nullptr;
        partner.state.store(status::posted, std::memory_order_release);
        queue(partner, /*mine=*/true).push_front(&partner);
        op.state.store(status::cancelled, std::memory_order_release);
        break;
      }
      case status::moving:
        wakeups_[op.owner()].wait(lock, [&] { return op.now() == status::done; });
        break;
      default:
        break;
    }
  }

  // Marks `rank` failed: every operation not yet matched fails with the kind
  // peer_failure_kind gives `cause` (peer_lost, or the job's own mismatch, timeout or
  // config), so a rank that hears of a bad setting before it reaches its own check of it
  // reports it as the ranks that reached theirs do.
  void fail(int rank, errc cause, const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (failed_rank_ >= 0) return;
    failed_rank_ = rank;
    failure_cause_ = peer_failure_kind(cause);
    failure_reason_ = reason;
    for (int r = 0; r < size_; ++r) wakeups_[r].notify_all();
  }

 private:
  // Moves the bytes of a matched pair outside the lock, so other pairs are not held up;
  // `op` is one of the pair, and `lock` is held on entry and on return.
  void move_bytes(std::unique_lock<std::mutex>& lock, inproc_op& op) {
    inproc_op& other = *op.partner;
    set_state(op, other, status::moving);
    lock.unlock();
    inproc_op& send = op.is_send ? op : other;
    inproc_op& recv = op.is_send ? other : op;
    if (send.bytes != recv.bytes) {
      const std::string what =
          size_mismatch_message(send.source, send.bytes, send.tag, recv.destination, recv.bytes);
      for (inproc_op* o : {&send, &recv}) o->failure = errc::mismatch, o->failure_message = what;
    } else if (send.bytes) {
      recv.deliver(recv.data, send.data, send.bytes);
    }
    lock.lock();
    op.partner = other.partner = nullptr;
    // Once `done` is published the other side may free its op at once (its wait can
    // see `done` without the lock), so nothing of it is read after that.
    auto& wakeup = wakeups_[other.owner()];
    set_state(op, other, status::done);
    wakeup.notify_all();
  }

  // Most matches in a ring complete within microseconds: looking for them on the CPU
  // avoids a futex sleep and wake-up, which costs more than a short message. How long,
  // and whether spinning or yielding: wait_policy_ (wait_policy.hpp).
  void poll_while_pending(const inproc_op& op, deadline until) noexcept {
    if (wait_policy_.spin.count() <= 0 && wait_policy_.yield.count() <= 0) return;
    auto pending = [&] {
      const status s = op.now();
      return s == status::posted || s == status::moving;
    };
    if (!pending()) return;
    const auto start = clock::now();
    const auto spin_end = std::min(until, start + wait_policy_.spin);
    // The clock is read every 64 pauses (a pause is ~10-140 cycles): cheap next to them.
    for (unsigned i = 1; pending(); ++i) {
      if (i % 64 == 0 && clock::now() >= spin_end) break;
      support::cpu_relax();
    }
    yield_state& mine = yield_state_[static_cast<std::size_t>(op.owner())];
    if (start.time_since_epoch().count() < mine.off_until.load(std::memory_order_relaxed)) return;
    const auto yield_end = std::min(until, start + wait_policy_.spin + wait_policy_.yield);
    for (auto before = clock::now(); pending() && before < yield_end;) {
      std::this_thread::yield();
      const auto after = clock::now();
      if (after - before > slow_yield) {  // the CPU went away for a time slice: back off
        const clock::time_point last(clock::duration(mine.last_slow.exchange(after.time_since_epoch().count(),
                                                                               std::memory_order_relaxed)));
        const int strikes = yield_strikes_after(mine.strikes.load(std::memory_order_relaxed), after - last);
        mine.strikes.store(strikes, std::memory_order_relaxed);
        mine.off_until.store((after + yield_back_off(strikes)).time_since_epoch().count(), std::memory_order_relaxed);
        return;
      }
      before = after;
    }
  }

  static void set_state(inproc_op& a, inproc_op& b, status s) noexcept {
    a.state.store(s, std::memory_order_release);
    b.state.store(s, std::memory_order_release);
  }

  std::deque<inproc_op*>& queue(const inproc_op& op, bool mine) {
    const std::size_t key = static_cast<std::size_t>(op.source) * size_ + op.destination;
    return (op.is_send == mine) ? sends_[key] : receives_[key];
  }

  void unpost(inproc_op& op) {
    auto& q = queue(op, /*mine=*/true);
    q.erase(std::remove(q.begin(), q.end(), &op), q.end());
    op.state.store(status::cancelled, std::memory_order_release);
  }

  void throw_if_failed(int me, const inproc_op& op) const {
    if (failed_rank_ < 0) return;
    throw error(failure_cause_, abandoned_by_message(me, describe(op), failed_rank_, failure_reason_));
  }

  const int size_;
  const cluster::topology topology_;
  const inproc_wait_policy wait_policy_;
  // Per rank: until when (clock ticks) its waits sleep without yielding, and how many
  // back-offs in a row led there (see slow_yield).
  struct yield_state {
    std::atomic<clock::rep> off_until{0};
    std::atomic<clock::rep> last_slow{0};  // when the last slow yield returned
    std::atomic<int> strikes{0};
  };
  std::unique_ptr<yield_state[]> yield_state_;
  std::mutex mutex_;
  std::unique_ptr<std::condition_variable[]> wakeups_;  // one per rank: wake only the owner
  std::vector<std::deque<inproc_op*>> sends_, receives_;  // [source * size + destination]
  int failed_rank_ = -1;
  errc failure_cause_ = errc::peer_lost;
  std::string failure_reason_;
};

}  // namespace gradwire::transport::detail
