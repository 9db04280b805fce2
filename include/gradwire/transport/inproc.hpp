// In-process transport: N ranks as threads in one process, single-copy tagged messages.
//
// A send and a receive with the same (source, destination, tag) are matched in the
// order they were posted. The bytes then move in one pass straight from the sender's
// buffer into the receiver's (copied, or added for async_recv_accumulate), nothing is
// allocated per byte, and the pass is made by whichever of the two ranks claims it
// first: the receiver when it posts second, otherwise whichever side waits first. In a
// ring every rank thus moves its own incoming message, in parallel with the others.
//
// How a rank waits (inproc_wait_policy, chosen once per group by choose_wait_policy from
// the group's size and the CPUs this process may run on): first, only when the machine
// has a CPU to spare beyond one per rank, up to 1 us spinning with pause instructions;
// then, up to 50 us from the start, looking again after each sched_yield; then asleep on
// its condition variable until woken or its deadline. Every phase ends at the deadline.
// (The CPU facts are every transport's, support/waiting.hpp; the process transports also
// learn there whether their longer hot poll pays, spin_gate, which a 1 us spin needs not.)
// Why, measured on 2 CPUs shared with compilers (load 5-9), all-reduce, settings or
// builds interleaved run by run: a spinning rank helps only while the rank it waits for
// runs on another CPU, and the affinity mask does not promise that: the scheduler puts
// both ends of a message on one CPU, and a spin only keeps the peer off it (2 ranks, 4 B:
// a 50 us spin, the old policy for 2 ranks on 2 CPUs, 110 us in most runs, every message
// paying the whole spin; spin 2, 5, 10 us then sleep: 14, 20, 30 us; sleep at once:
// 16 us). A yield hands the CPU to the peer when the peer is queued there and costs one
// system call otherwise (7.4 us), and beat sleeping at once up to 16 ranks on 2 CPUs
// (4 B: 297 against 540 us). But a yield also hands the CPU to a busy process queued
// there, which keeps it for its time slice, while a sleeping rank, once woken, takes its
// CPU back at once: with a CPU-bound process per CPU, yielding every time took 4-12 ms
// per all-reduce in most runs (4 ranks; a slice per message). So a yield that takes
// longer than slow_yield stops the rank's yielding for a back-off that grows while slow
// yields keep coming (see slow_yield). Before/after, 4 B, median of 5-6 runs [min-max]:
// 2 ranks 110 [14-110] -> 7.7 [7.4-11] us; with two CPU-bound processes beside it
// 111 [110-111] -> 11 [7.5-23]; 4 ranks 17 [10-39] -> 29 [16-34] (the price: sleeping
// waits after slow yields), with the two busy processes 4,033 [10-12,011] -> 51 [30-56].
//
// If a rank fails (inproc_group::run catches its exception), every other rank's pending
// and future operations fail naming it, rather than waiting for their deadlines: with
// peer_lost, or with its own kind for a mismatch, timeout or config error
// (detail::peer_failure_kind, every transport's rule).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../support/topology.hpp"
#include "../support/waiting.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../timeouts.hpp"
#include "detail/deliver.hpp"
#include "detail/messages.hpp"
#include "detail/pending_request.hpp"
#include "detail/failure.hpp"
#include "traffic.hpp"

namespace gradwire::transport {

// How a waiting rank waits before it sleeps: `spin` on the CPU with pause instructions,
// then until `spin + yield` looking again after each yield of its CPU, then asleep until
// woken or the deadline. Both zero: sleep at once. See the top of this header.
struct inproc_wait_policy {
  std::chrono::nanoseconds spin{};
  std::chrono::nanoseconds yield{};
  friend bool operator==(const inproc_wait_policy&, const inproc_wait_policy&) = default;
};

// The wait policy of `ranks` threads on `cpus` CPUs (see the top of this header for why):
// with a CPU to spare, spin 1 us then yield to 50 us; otherwise yield for 50 us.
inline inproc_wait_policy choose_wait_policy(int ranks, unsigned cpus) noexcept {
  using std::chrono::microseconds;
  if (static_cast<unsigned>(std::max(ranks, 1)) < std::max(cpus, 1u)) return {microseconds(1), microseconds(49)};
  return {microseconds(0), microseconds(50)};
}

namespace detail {

// A yield that takes longer than slow_yield gave its CPU away for a scheduler time slice
// (milliseconds; to another process, or to a peer copying a large message), not to a
// peer passing a short message (microseconds). The rank then sleeps instead of yielding
// for a while: first_yield_back_off, doubled for each slow yield that follows the last
// within yield_strikes_forgotten, up to max_yield_strikes (1, 2, 4 .. 64 ms). So a CPU
// that stays busy costs a slice now and then, not one per message, and a passing burst
// costs a millisecond of sleeping waits (see the top of this header).
inline constexpr auto slow_yield = std::chrono::milliseconds(1);
inline constexpr auto first_yield_back_off = std::chrono::milliseconds(1);
inline constexpr int max_yield_strikes = 7;
inline constexpr auto yield_strikes_forgotten = std::chrono::milliseconds(200);

// The slow yields in a row after one more came `since_last` after the previous one.
inline int yield_strikes_after(int strikes, clock::duration since_last) noexcept {
  return since_last > yield_strikes_forgotten ? 1 : std::clamp(strikes + 1, 1, max_yield_strikes);
}

// How long a rank sleeps without yielding after `strikes` slow yields in a row.
inline clock::duration yield_back_off(int strikes) noexcept {
  return first_yield_back_off * (1 << (std::clamp(strikes, 1, max_yield_strikes) - 1));
}

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
  // and whether spinning or yielding: wait_policy_ (see the top of this header).
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

}  // namespace detail

// One rank's endpoint. Cheap to copy; all endpoints of a group share one hub.
class inproc {
 public:
  using request = detail::pending_request<detail::inproc_hub, detail::inproc_op>;
  // Ranks are threads of this process: device collectives share buffers directly.
  static constexpr bool shares_address_space = true;
  // The ring all-reduce pipelines its parts in segments of this many bytes
  // (collective/detail/ring.hpp): a segment is received, added and sent on while it is
  // still in cache. 64 KiB beat 32, 128 and 256 (2-core VM, benchmarks/allreduce_inproc,
  // medians of 6 interleaved runs, unpipelined -> pipelined: 2 ranks 1 MiB 123 -> 77 us,
  // 4 MiB 328 -> 159, 16 MiB 2227 -> 1267; 4 ranks 4 MiB 1015 -> 871).
  static constexpr std::size_t ring_segment_bytes = 64 * 1024;

  inproc(std::shared_ptr<detail::inproc_hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {
    if (!hub_ || rank_ < 0 || rank_ >= hub_->size())
      throw error(errc::invalid_argument, "inproc: rank " + std::to_string(rank_) + " outside the group");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return hub_->size(); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    // The sender's buffer is only ever read (it is the memcpy source).
    return post(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size());
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    return post(false, peer, tag, bytes.data(), bytes.size());
  }
  // Receives a message of inout.size() elements and adds it into inout (inout[i] +=
  // message[i]) in the same pass that moves it: no staging copy.
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return post(false, peer, tag, reinterpret_cast<std::byte*>(inout.data()), inout.size_bytes(),
                &detail::deliver_accumulate<V>);
  }
  void wait(request& r, deadline until) {
    const auto op = r.take();
    if (!op) throw error(errc::invalid_argument, "inproc: wait on an empty or already finished request");
    hub_->wait(*op, until);
  }

  // Returns the index of one of `requests` that wait() completes without waiting for a peer.
  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    return hub_->wait_any(
        requests.size(), [&](std::size_t i) { return requests[i] ? requests[i]->peek() : nullptr; }, rank_, until);
  }

  // Marks this rank failed so that peers stop waiting for it (see inproc_group::run).
  void fail(errc cause, const std::string& reason) { hub_->fail(rank_, cause, reason); }

  // Payload this rank has sent and received (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

  // The hosts the group's threads pretend to be on (inproc_group's topology; one host
  // unless a test says otherwise): concepts::topology_aware_transport.
  const cluster::topology& topology() const noexcept { return hub_->topology(); }

 private:
  request post(bool is_send, int peer, std::uint64_t tag, std::byte* data, std::size_t bytes,
               detail::deliver_fn deliver = &detail::deliver_copy) {
    detail::check_peer("inproc", rank_, peer, size());
    detail::check_tag("inproc", tag);
    auto op = detail::make_operation<detail::inproc_op>(is_send, rank_, peer, tag, data, bytes, deliver);
    hub_->post(*op);
    is_send ? traffic_.sent(bytes) : traffic_.received(bytes);
    return request(hub_, std::move(op));
  }

  std::shared_ptr<detail::inproc_hub> hub_;
  int rank_;
  traffic_counters traffic_;
};

static_assert(concepts::transport<inproc>);
static_assert(concepts::accumulating_transport<inproc, float> && concepts::accumulating_transport<inproc, double>);
static_assert(concepts::failable_transport<inproc> && concepts::multiplexing_transport<inproc>);
static_assert(concepts::shared_address_space_transport<inproc> && concepts::metered_transport<inproc>);
static_assert(concepts::topology_aware_transport<inproc>);

// A group of N in-process ranks: hands out endpoints and runs one thread per rank.
class inproc_group {
 public:
  // `wait_policy`: how waiting ranks wait (default: chosen for `size` threads on the CPUs
  // this process may use; see the top of this header).
  explicit inproc_group(int size) : inproc_group(size, choose_wait_policy(size, support::usable_cpus())) {}
  inproc_group(int size, inproc_wait_policy wait_policy) {
    if (size < 1) throw error(errc::invalid_argument, "inproc_group: size must be >= 1, got " + std::to_string(size));
    hub_ = std::make_shared<detail::inproc_hub>(size, cluster::topology::one_host(size), wait_policy);
  }
  // Threads that pretend to sit on the hosts `topology` says (tests of topology-aware
  // collectives): one rank per rank of the topology.
  explicit inproc_group(cluster::topology topology)
      : inproc_group(topology, choose_wait_policy(topology.size(), support::usable_cpus())) {}
  inproc_group(cluster::topology topology, inproc_wait_policy wait_policy) {
    const int size = topology.size();
    hub_ = std::make_shared<detail::inproc_hub>(size, std::move(topology), wait_policy);
  }

  int size() const noexcept { return hub_->size(); }
  const inproc_wait_policy& wait_policy() const noexcept { return hub_->wait_policy(); }
  inproc endpoint(int rank) const { return inproc(hub_, rank); }

  // Runs fn(endpoint) on one thread per rank and returns each rank's outcome (null on
  // success). A rank that throws marks itself failed, so the others stop waiting.
  template <class Fn>
  std::vector<std::exception_ptr> run(Fn&& fn) {
    std::vector<std::exception_ptr> outcomes(static_cast<std::size_t>(size()));
    {
      std::vector<std::jthread> threads;
      threads.reserve(outcomes.size());
      for (int r = 0; r < size(); ++r)
        threads.emplace_back([&, r] {
          try {
            fn(endpoint(r));
          } catch (...) {
            outcomes[r] = std::current_exception();
            const detail::rank_failure f = detail::failure_of(outcomes[r]);
            hub_->fail(r, f.cause, f.reason);
          }
        });
    }
    return outcomes;
  }

 private:
  std::shared_ptr<detail::inproc_hub> hub_;
};

// Runs fn(endpoint) on one thread per rank of `group` and rethrows the root cause if any
// rank failed: the first failure that is not a consequence (peer_lost) of another's.
template <class Fn>
void run_inproc(inproc_group group, Fn&& fn) {
  detail::rethrow_root_cause(group.run(std::forward<Fn>(fn)));
}

// As above on topology.size() threads, placed on the hosts `topology` says.
template <class Fn>
void run_inproc(cluster::topology topology, Fn&& fn) {
  run_inproc(inproc_group(std::move(topology)), std::forward<Fn>(fn));
}

// As above on `size` threads of one host.
template <class Fn>
void run_inproc(int size, Fn&& fn) {
  if (size < 1) throw error(errc::invalid_argument, "run_inproc: size must be >= 1, got " + std::to_string(size));
  run_inproc(cluster::topology::one_host(size), std::forward<Fn>(fn));
}

}  // namespace gradwire::transport
