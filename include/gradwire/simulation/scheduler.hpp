// The conservative discrete-event scheduler: N ranks' real code run one at a time, in virtual-time order.
//
// Every rank is a thread, but only one runs at any moment: the one holding the baton.
// A rank's virtual clock advances by the compute it does (its CPU time between transport
// calls times its speed factors, or simulation::compute(d)) and by waiting for messages.
// At every transport call the running rank offers the baton to the rank that is furthest
// behind in virtual time (ties go to the lower rank), so that operations take effect in
// the order of their virtual times: messages reserve links in time order, a server's
// wait_any sees requests in the order they arrive. A rank blocked on a receive whose
// sender has not sent yet has no time to offer; it waits until one of its operations has
// a known completion, its deadline (now + the time left on the real deadline it was
// given), or its death in the model, whichever is first. Nothing depends on the real
// time a thread takes, so a run is reproducible from the model's seed (with
// compute=modelled exactly; with compute=measured up to the jitter of CPU time).
//
// Messages are eager: a send completes when its bytes have left the sender (network.hpp),
// and a message whose receive is not posted yet waits in a staging buffer. A rank that
// throws, fails (concepts::failable_transport) or dies (the model's die=RANK@TIME) is
// lost: the others learn it one latency later; from then on their unfinished operations
// with it fail with peer_lost, and, unless they tolerate its loss, all of their
// unfinished operations do, as on the network transports. A rank that returns closes its
// endpoint: receives from it that nothing will match fail with peer_lost.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <semaphore>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if __has_include(<time.h>)
#include <time.h>
#endif

#include "../error.hpp"
#include "../support/traffic.hpp"
#include "../support/virtual_clock.hpp"
#include "../timeouts.hpp"
#include "../transport/detail/deliver.hpp"
#include "../transport/detail/messages.hpp"
#include "cluster_model.hpp"
#include "network.hpp"

namespace gradwire::simulation {

// Thrown on a rank's thread when the model says it dies; the group's run() ends the
// thread quietly (the death is the model's, not the rank's failure).
struct rank_died {
  int rank;
  time_point at;
};

namespace detail {

inline constexpr time_point never = time_point::max();

struct sim_op {
  bool is_send = false;
  int source = 0, destination = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;  // a send's bytes are only read through it
  std::size_t bytes = 0;
  transport::detail::deliver_fn deliver = transport::detail::deliver_copy;
  bool done = false;       // completes at complete_at (maybe later than now)
  bool withdrawn = false;  // cancelled before it was matched
  time_point posted_at{};
  time_point complete_at = never;
  errc failure{};
  std::string failure_message;

  int owner() const noexcept { return is_send ? source : destination; }
  int peer() const noexcept { return is_send ? destination : source; }
};

// A message whose receive was not posted when it arrived at the matching stage.
struct staged_message {
  std::uint64_t tag = 0;
  std::vector<std::byte> bytes;
  time_point arrives{};
};

// How a rank learnt that a peer is gone.
struct peer_loss {
  time_point known_at = never;  // when this rank learns it (the loss time + one latency)
  errc cause = errc::peer_lost;
  std::string reason;
  bool failed = false;  // lost by failure (else it closed its endpoint after returning)
};

inline std::int64_t thread_cpu_ns() noexcept {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
#else
  return 0;
#endif
}

class scheduler;

// One rank: its clocks, its baton, what it waits for, and what it knows of lost peers.
struct rank_state final : support::virtual_clock {
  enum class status : std::uint8_t { idle, running, ready, waiting, finished };

  scheduler* owner = nullptr;
  int rank = 0;
  time_point clock{};             // the caller's clock
  time_point background_end{};    // when the last background work finished
  status state = status::idle;
  std::binary_semaphore baton{0};
  // Compute accounting.
  std::int64_t cpu_mark = 0;  // thread CPU time when compute was last counted
  double fixed_factor = 1;    // speed x this rank's slow= factor
  double step_factor = 1;     // this step's random factor
  std::mt19937_64 rng;
  time_point dies_at = never;
  // While waiting: the operations (null entries ignored) and the virtual deadline.
  std::span<sim_op* const> awaited;
  time_point wait_deadline = never;
  std::set<std::pair<time_point, int>>::iterator agenda_entry;
  time_point agenda_time{};  // when it is scheduled to go next
  bool in_agenda = false;
  bool deadlocked = false;   // woken to report that nobody can make progress
  // Peers: which losses it tolerates and what it knows of lost peers.
  std::vector<bool> tolerated;
  std::vector<peer_loss> lost;  // per peer; known_at == never: not lost
  std::vector<int> lost_order;  // peers in the order they were lost (lost_peers())
  bool failed = false;          // this rank failed (fail(), an exception, a death)
  support::traffic_counters traffic;

  std::int64_t now_ns() override;
  std::int64_t run_in_background(void (*work)(void*), void* context) override;
  void advance_to(std::int64_t ns) override;
  void step_began() override;

  // Counts the compute since the last transport call into the clock.
  void charge_compute();
  duration stretched(duration d) const noexcept {
    return duration(static_cast<std::int64_t>(double(d.count()) * fixed_factor * step_factor));
  }
};

class scheduler {
 public:
  explicit scheduler(cluster_model model)
      : model_((model.validate(), std::move(model))),
        network_(model_),
        ranks_(static_cast<std::size_t>(model_.size())),
        receives_(static_cast<std::size_t>(model_.size()) * model_.size()) {
    const int n = model_.size();
    for (int r = 0; r < n; ++r) {
      auto& s = state(r);
      s.owner = this;
      s.rank = r;
      s.fixed_factor = model_.speed * model_.stragglers.fixed_factor(r);
      s.rng.seed(model_.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(r) + 1);
      s.step_factor = model_.stragglers.random() ? model_.stragglers.draw(s.rng) : 1.0;
      s.tolerated.assign(static_cast<std::size_t>(n), false);
      s.lost.assign(static_cast<std::size_t>(n), {});
    }
    for (const auto& d : model_.deaths) state(d.rank).dies_at = std::min(state(d.rank).dies_at, d.at);
  }

  const cluster_model& model() const noexcept { return model_; }
  int size() const noexcept { return model_.size(); }
  rank_state& state(int r) noexcept { return ranks_[static_cast<std::size_t>(r)]; }

  // --- Running the ranks' threads ---------------------------------------------------

  // The thread of rank r starts here: it waits for its first turn.
  void enter(int r) {
    auto& s = state(r);
    s.baton.acquire();
    support::this_thread_virtual_clock() = &s;
    s.cpu_mark = thread_cpu_ns();
  }

  // Starts the run: every rank is ready at time 0, rank 0 goes first.
  void start() {
    for (int r = 0; r < size(); ++r) {
      state(r).state = rank_state::status::ready;
      schedule(state(r), time_point{});
    }
    pass_baton();
  }

  // Rank r's function returned (failure: it threw, with that cause and reason).
  void leave(int r, std::optional<std::pair<errc, std::string>> failure) {
    auto& s = state(r);
    if (!s.failed) s.charge_compute();  // a dead rank's clock stays at its death
    if (failure) lose(r, s.clock, failure->first, failure->second, true);
    else lose(r, s.clock, errc::peer_lost, "finished and closed its endpoint at virtual time " + seconds(s.clock), false);
    s.state = rank_state::status::finished;
    unschedule(s);
    support::this_thread_virtual_clock() = nullptr;
    ++finished_;
    pass_baton();  // another rank's turn, or nobody's when all have finished
  }

  // Rank r died at `at` (the model's die=RANK@TIME): as leave() with a failure.
  void die(int r, time_point at) {
    auto& s = state(r);
    s.clock = at;
    s.failed = true;
    lose(r, at, errc::peer_lost, "it died at virtual time " + seconds(at) + " (the cluster model's die=" +
                                     std::to_string(r) + "@" + std::to_string(double(at.count()) / 1e9) + "s)", true);
  }

  // Blocks the caller (not a rank) until every rank has left.
  void join_all() { all_done_.acquire(); }

  // --- The transport's operations (on the running rank's thread) ---------------------

  // The running rank r reaches a transport call: counts its compute and lets ranks that
  // are behind it in virtual time go first.
  void sync(int r) {
    auto& s = state(r);
    s.charge_compute();
    check_death(s);
    if (behind(s)) {
      s.state = rank_state::status::ready;
      schedule(s, s.clock);
      pass_baton_and_wait(s);
      s.cpu_mark = thread_cpu_ns();
    }
    check_death(s);
  }

  void post_send(sim_op& op) {
    auto& s = state(op.source);
    s.clock += model_.overhead;
    op.posted_at = s.clock;
    s.traffic.sent(op.bytes);
    if (auto d = doom(s, op.destination); d && d->at <= s.clock) {
      fail_op(op, s.clock, d->cause, d->message);
      return;
    }
    const message_times t = network_.send(op.source, op.destination, op.bytes, s.clock);
    op.done = true;
    op.complete_at = t.sent;
    maybe_prune();
    auto& waiting = queue(receives_, op.source, op.destination);
    auto match = std::find_if(waiting.begin(), waiting.end(), [&](sim_op* o) { return o->tag == op.tag; });
    if (match != waiting.end()) {
      sim_op& recv = **match;
      waiting.erase(match);
      deliver(recv, op.data, op.bytes, t.arrived, op);
      return;
    }
    if (state(op.destination).state == rank_state::status::finished) return;  // nobody will receive it
    staged_message m;
    m.tag = op.tag;
    m.bytes = take_buffer(op.bytes);
    if (op.bytes) std::memcpy(m.bytes.data(), op.data, op.bytes);
    m.arrives = t.arrived;
    queue(staged_, op.source, op.destination).push_back(std::move(m));
  }

  void post_recv(sim_op& op) {
    auto& s = state(op.destination);
    op.posted_at = s.clock;
    s.traffic.received(op.bytes);
    auto& staged = queue(staged_, op.source, op.destination);
    auto match = std::find_if(staged.begin(), staged.end(), [&](const staged_message& m) { return m.tag == op.tag; });
    if (match != staged.end()) {
      staged_message m = std::move(*match);
      staged.erase(match);
      sim_op sent;  // stands in for the send in a mismatch message
      sent.is_send = true;
      sent.source = op.source;
      sent.tag = op.tag;
      deliver(op, m.bytes.data(), m.bytes.size(), std::max(m.arrives, s.clock), sent);
      give_buffer(std::move(m.bytes));
      return;
    }
    // Nothing will match it once the rank knows its sender (or, for a rank that does not
    // tolerate it, any rank) is gone.
    if (auto d = doom(s, op.source)) {
      fail_op(op, std::max(s.clock, d->at), d->cause, d->message);
      return;
    }
    queue(receives_, op.source, op.destination).push_back(&op);
  }

  // The transport call is over: the CPU time it took is not the rank's compute.
  void end_call(int r) noexcept { state(r).cpu_mark = thread_cpu_ns(); }

  // Waits until one of `ops` (null entries skipped) has completed; returns its index. The
  // rank's clock moves to its completion. Throws timeout at the virtual deadline.
  std::size_t wait_any(int r, std::span<sim_op* const> ops, deadline until) {
    auto& s = state(r);
    sync(r);
    const time_point limit = virtual_deadline(s, until);
    for (;;) {
      if (auto i = earliest_done(ops); i && ops[*i]->complete_at <= s.clock) return finish_wait(s, *ops[*i], *i);
      // Block: the scheduler wakes this rank at the earliest of its known completions,
      // its deadline and its death, once every rank behind that time has run.
      s.awaited = ops;
      s.wait_deadline = limit;
      s.state = rank_state::status::waiting;
      const time_point wake = wake_time(s);
      if (wake != never) schedule(s, wake);
      pass_baton_and_wait(s);
      s.awaited = {};
      const time_point now = std::max(s.clock, s.agenda_time);
      s.clock = now;
      check_death(s);
      if (auto i = earliest_done(ops); i && ops[*i]->complete_at <= s.clock) return finish_wait(s, *ops[*i], *i);
      if (s.deadlocked) {
        s.deadlocked = false;
        throw error(errc::timeout, "rank " + std::to_string(r) + ": the simulated job is deadlocked at virtual time " +
                                       seconds(s.clock) + ": every rank waits for a message nobody will send (" +
                                       describe_wait(ops) + ")");
      }
      if (s.clock >= limit)
        throw error(errc::timeout, transport::detail::timeout_message(r, describe_wait(ops)) +
                                       " (virtual time " + seconds(s.clock) + ")");
    }
  }

  // Withdraws an operation that will not be waited for (its request was dropped).
  void cancel(sim_op& op) noexcept {
    if (op.done || op.withdrawn) return;
    unqueue(op);
    op.withdrawn = true;
  }

  // The rank failed (concepts::failable_transport): its peers learn it one latency later.
  void fail(int r, errc cause, const std::string& reason) {
    auto& s = state(r);
    if (s.failed) return;
    s.failed = true;
    lose(r, s.clock, cause == errc::mismatch ? errc::mismatch : errc::peer_lost, reason, true);
  }

  void tolerate_loss(int r, int peer) {
    state(r).tolerated.at(static_cast<std::size_t>(peer)) = true;
  }

  std::vector<int> lost_peers(int r) {
    auto& s = state(r);
    std::vector<int> out;
    for (int p : s.lost_order)
      if (s.lost[static_cast<std::size_t>(p)].known_at <= s.clock && s.lost[static_cast<std::size_t>(p)].failed)
        out.push_back(p);
    return out;
  }

  static std::string seconds(time_point t) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6f s", double(t.count()) / 1e9);
    return text;
  }

 private:
  friend struct rank_state;
  using agenda_type = std::set<std::pair<time_point, int>>;

  // --- Turn-taking -------------------------------------------------------------------

  void schedule(rank_state& s, time_point at) {
    unschedule(s);
    s.agenda_entry = agenda_.emplace(at, s.rank).first;
    s.in_agenda = true;
    s.agenda_time = at;
  }
  void unschedule(rank_state& s) {
    if (!s.in_agenda) return;
    agenda_.erase(s.agenda_entry);
    s.in_agenda = false;
  }

  // Whether another rank must go before s: it is scheduled earlier (or as early, lower rank).
  bool behind(const rank_state& s) const noexcept {
    return !agenda_.empty() && *agenda_.begin() < std::pair<time_point, int>(s.clock, s.rank);
  }

  // The rank to go next: first in the agenda. When the agenda is empty but ranks still
  // wait (with no deadline), nobody can make progress: the lowest of them is woken to
  // report the deadlock. -1: every rank has finished.
  int next_rank() {
    if (agenda_.empty()) {
      for (auto& w : ranks_)
        if (w.state == rank_state::status::waiting) {
          w.deadlocked = true;
          schedule(w, w.clock);
          break;
        }
      if (agenda_.empty()) return -1;
    }
    const int next = agenda_.begin()->second;
    auto& n = state(next);
    unschedule(n);
    n.state = rank_state::status::running;
    return next;
  }

  // Hands the baton on (to nobody when all have finished: the run is over).
  void pass_baton() {
    const int next = next_rank();
    if (next >= 0) state(next).baton.release();
    else if (finished_ == size()) all_done_.release();
  }

  // Hands the baton on and waits for it to come back (at once when s goes next itself).
  void pass_baton_and_wait(rank_state& s) {
    const int next = next_rank();
    if (next == s.rank) return;
    if (next >= 0) state(next).baton.release();
    s.baton.acquire();
  }

  // When a waiting rank can next make progress.
  time_point wake_time(const rank_state& s) const noexcept {
    time_point t = std::min(s.wait_deadline, s.dies_at);
    for (const sim_op* op : s.awaited)
      if (op && op->done) t = std::min(t, op->complete_at);
    return t == never ? never : std::max(t, s.clock);
  }

  // An operation of a waiting rank completed: it may wake earlier.
  void completed(sim_op& op) {
    auto& s = state(op.owner());
    if (s.state != rank_state::status::waiting) return;
    if (std::find(s.awaited.begin(), s.awaited.end(), &op) == s.awaited.end()) return;
    const time_point wake = wake_time(s);
    if (!s.in_agenda || wake < s.agenda_time) schedule(s, wake);
  }

  void check_death(rank_state& s) {
    if (s.clock >= s.dies_at && !s.failed) {
      die(s.rank, s.dies_at);
      throw rank_died{s.rank, s.dies_at};
    }
  }

  time_point virtual_deadline(const rank_state& s, deadline until) const noexcept {
    if (until == deadline::max()) return never;
    // The time left on the real deadline, in whole milliseconds (so that a deadline set
    // microseconds earlier in real time gives the same virtual one).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now() +
                                                                            std::chrono::microseconds(500));
    return s.clock + std::max(duration(0), std::chrono::duration_cast<duration>(left));
  }

  static std::optional<std::size_t> earliest_done(std::span<sim_op* const> ops) noexcept {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i] && ops[i]->done && (!best || ops[i]->complete_at < ops[*best]->complete_at)) best = i;
    return best;
  }

  std::size_t finish_wait(rank_state& s, sim_op& op, std::size_t i) {
    s.clock = std::max(s.clock, op.complete_at);
    s.state = rank_state::status::running;
    return i;
  }

  static std::string describe_wait(std::span<sim_op* const> ops) {
    std::string out;
    int shown = 0;
    for (const sim_op* op : ops) {
      if (!op) continue;
      if (shown++ == 3) {
        out += ", ...";
        break;
      }
      if (!out.empty()) out += ", ";
      out += transport::detail::describe_operation(op->is_send, op->peer(), op->tag, op->bytes);
    }
    return out;
  }

  // --- Messages ----------------------------------------------------------------------

  std::deque<sim_op*>& queue(std::vector<std::deque<sim_op*>>& q, int from, int to) {
    return q[static_cast<std::size_t>(from) * size() + to];
  }
  std::deque<staged_message>& queue(std::vector<std::deque<staged_message>>& q, int from, int to) {
    return q[static_cast<std::size_t>(from) * size() + to];
  }
  void unqueue(sim_op& op) {
    if (op.is_send) return;
    auto& q = queue(receives_, op.source, op.destination);
    q.erase(std::remove(q.begin(), q.end(), &op), q.end());
  }

  void deliver(sim_op& recv, const std::byte* bytes, std::size_t size, time_point arrives, sim_op& send) {
    if (size != recv.bytes) {
      const std::string what =
          transport::detail::size_mismatch_message(send.source, size, send.tag, recv.destination, recv.bytes);
      send.failure = recv.failure = errc::mismatch;
      send.failure_message = "rank " + std::to_string(send.source) + ": " + what;
      recv.failure_message = "rank " + std::to_string(recv.destination) + ": " + what;
    } else if (size) {
      recv.deliver(recv.data, bytes, size);
    }
    recv.done = true;
    recv.complete_at = arrives + model_.overhead;
    completed(recv);
  }

  void fail_op(sim_op& op, time_point at, errc cause, std::string message) {
    op.failure = cause;
    op.failure_message = std::move(message);
    op.done = true;
    op.complete_at = at;
    completed(op);
  }

  struct doom_info {
    time_point at;
    errc cause;
    std::string message;
  };

  // When and how operations of s with `peer` stop being possible: the peer is gone (it
  // failed or closed), or another rank failed whose loss s does not tolerate; the
  // earliest of those, as s learns them.
  std::optional<doom_info> doom(const rank_state& s, int peer) const {
    std::optional<doom_info> d;
    auto consider = [&](int p) {
      const auto& l = s.lost[static_cast<std::size_t>(p)];
      if (l.known_at == never || (d && d->at <= l.known_at)) return;
      const bool tolerated = s.tolerated[static_cast<std::size_t>(p)];
      if (p != peer && (!l.failed || tolerated)) return;
      std::string message =
          !l.failed ? "rank " + std::to_string(s.rank) + ": rank " + std::to_string(p) + " " + l.reason
          : tolerated ? transport::detail::tolerated_peer_failed_message(s.rank, p, l.reason)
                      : transport::detail::peer_failed_message(s.rank, p, l.reason);
      d = doom_info{l.known_at, l.failed ? l.cause : errc::peer_lost, std::move(message)};
    };
    consider(peer);
    for (int p : s.lost_order) consider(p);
    return d;
  }

  // Rank r is gone at `at`: every other rank learns it one latency later, and its
  // receives that nothing will match now fail then.
  void lose(int r, time_point at, errc cause, const std::string& reason, bool failed) {
    for (int q = 0; q < size(); ++q) {
      if (q == r) continue;
      auto& s = state(q);
      if (s.state == rank_state::status::finished) continue;
      auto& loss = s.lost[static_cast<std::size_t>(r)];
      if (loss.known_at != never) continue;
      loss.known_at = at + model_.link_between(r, q).latency;
      loss.cause = cause;
      loss.reason = reason;
      loss.failed = failed;
      s.lost_order.push_back(r);
      for (int from = 0; from < size(); ++from) {
        auto& waiting = queue(receives_, from, q);
        for (auto it = waiting.begin(); it != waiting.end();) {
          auto d = doom(s, from);
          if (!d) break;
          sim_op& op = **it;
          it = waiting.erase(it);
          fail_op(op, std::max(op.posted_at, d->at), d->cause, d->message);
        }
      }
    }
  }

  std::vector<std::byte> take_buffer(std::size_t bytes) {
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->capacity() >= bytes) {
        std::vector<std::byte> b = std::move(*it);
        pool_.erase(it);
        b.resize(bytes);
        return b;
      }
    return std::vector<std::byte>(bytes);
  }
  void give_buffer(std::vector<std::byte> b) {
    if (pool_.size() < 256) pool_.push_back(std::move(b));
  }

  void maybe_prune() {
    if (!network_.wants_pruning()) return;
    time_point horizon = never;
    for (auto& s : ranks_)
      if (s.state != rank_state::status::finished) horizon = std::min(horizon, std::min(s.clock, s.background_end));
    if (horizon != never) network_.forget_before(horizon);
  }

  const cluster_model model_;
  network network_;
  std::vector<rank_state> ranks_;
  agenda_type agenda_;
  std::vector<std::deque<sim_op*>> receives_;  // posted, unmatched: [from * size + to]
  std::vector<std::deque<staged_message>> staged_{static_cast<std::size_t>(model_.size()) * model_.size()};
  std::vector<std::vector<std::byte>> pool_;
  int finished_ = 0;
  std::binary_semaphore all_done_{0};
};

inline void rank_state::charge_compute() {
  if (owner->model().compute == compute_model::measured) {
    const std::int64_t cpu = thread_cpu_ns();
    clock += stretched(duration(cpu - cpu_mark));
    cpu_mark = cpu;
  }
}

inline std::int64_t rank_state::now_ns() {
  charge_compute();
  return clock.count();
}

inline std::int64_t rank_state::run_in_background(void (*work)(void*), void* context) {
  charge_compute();
  const time_point caller = clock;
  clock = std::max(clock, background_end);
  try {
    work(context);
  } catch (...) {
    background_end = clock;
    clock = caller;
    throw;
  }
  charge_compute();
  background_end = clock;
  clock = caller;
  cpu_mark = thread_cpu_ns();
  return background_end.count();
}

inline void rank_state::advance_to(std::int64_t ns) {
  charge_compute();
  clock = std::max(clock, duration(ns));
}

inline void rank_state::step_began() {
  charge_compute();  // the compute so far ran at the previous step's pace
  if (owner->model().stragglers.random()) step_factor = owner->model().stragglers.draw(rng);
}

}  // namespace detail
}  // namespace gradwire::simulation
