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
// a known completion, its deadline, or its death in the model, whichever is first. When
// it is woken at time t, it is the rank furthest behind, so every message that arrives
// before t has been sent: what it then sees is what a real rank would see at t. Nothing
// depends on the real time a thread takes, so a run is reproducible from the model's seed
// (with compute=modelled exactly; with compute=measured up to the jitter of CPU time).
//
// Deadlines are virtual: on a simulated rank, gradwire::deadline_after() counts from the
// rank's virtual clock (support/virtual_clock.hpp). A deadline bounds the wait for a peer
// to send; a message already on its way is received when it arrives.
//
// Losses. A rank that throws, fails (concepts::failable_transport) or dies (the model's
// die=RANK@TIME) is lost: every other rank learns it one latency later. From then on its
// operations with the lost rank fail with peer_lost, and, unless it tolerates that loss,
// all of its operations do, as on the network transports; a receive posted before then
// fails then, unless its message arrives first. A rank that returns closes its endpoint:
// receives from it that nothing will match fail the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <semaphore>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <time.h>

#include "../error.hpp"
#include "../support/traffic.hpp"
#include "../support/virtual_clock.hpp"
#include "../timeouts.hpp"
#include "../transport/detail/messages.hpp"
#include "cluster_model.hpp"
#include "mailbox.hpp"
#include "network.hpp"

namespace gradwire::simulation {

// Thrown on a rank's thread when the model says it dies (and at every transport call it
// makes after that); the job's run() ends the thread quietly: the death is the model's,
// not the rank's failure.
struct rank_died {
  int rank;
  time_point at;
};

namespace detail {

// How a rank learnt that a peer is gone.
struct peer_loss {
  int peer = -1;
  time_point known_at = never;  // when this rank learns it (the loss time + one latency)
  errc cause = errc::peer_lost;
  std::string reason;
  bool failed = false;  // lost by failure (else it closed its endpoint after returning)
};

inline std::int64_t thread_cpu_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline std::string seconds(time_point t) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6f s", double(t.count()) / 1e9);
  return text;
}

class scheduler;

// Ends a transport call of a rank however it leaves (scheduler::end_call).
struct call_end {
  scheduler& s;
  int rank;
  ~call_end();
};

// One rank: its clocks, its baton, what it waits for, and what it knows of lost peers.
struct rank_state final : support::virtual_clock {
  enum class status : std::uint8_t { idle, running, ready, waiting, finished };

  scheduler* owner = nullptr;
  int rank = 0;
  time_point clock{};            // the caller's clock (the background clock while background work runs)
  time_point background_end{};   // when the last background work finished
  bool in_background = false;
  time_point caller_clock{};     // while in_background: the caller's clock, to go back to
  status state = status::idle;
  std::binary_semaphore baton{0};
  // Compute accounting.
  std::int64_t cpu_mark = 0;  // thread CPU time when compute was last counted
  double fixed_factor = 1;    // speed x this rank's slow= factor
  double step_factor = 1;     // this step's random factor (drawn at each step's start)
  std::mt19937_64 rng;
  time_point dies_at = never;
  bool died = false;
  // While waiting: the operations (null entries ignored) and the virtual deadline.
  std::span<sim_op* const> awaited;
  time_point wait_deadline = never;
  std::set<std::pair<time_point, int>>::iterator agenda_entry;
  time_point agenda_time{};  // when it is scheduled to go next
  bool in_agenda = false;
  bool deadlocked = false;  // woken to report that nobody can make progress
  // Peers: which losses it tolerates and the peers it knows are gone (few: a list).
  std::vector<bool> tolerated;
  std::vector<peer_loss> lost;
  bool failed = false;  // this rank failed (fail(), an exception, a death)
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
  const peer_loss* loss_of(int peer) const noexcept {
    for (const auto& l : lost)
      if (l.peer == peer) return &l;
    return nullptr;
  }
};

class scheduler {
 public:
  explicit scheduler(cluster_model model)
      : model_((model.validate(), std::move(model))),
        topology_(model_.topology()),
        network_(model_),
        mailbox_(model_.size()),
        ranks_(static_cast<std::size_t>(model_.size())) {
    const int n = model_.size();
    for (int r = 0; r < n; ++r) {
      auto& s = state(r);
      s.owner = this;
      s.rank = r;
      s.fixed_factor = model_.speed * model_.stragglers.fixed_factor(r);
      s.rng.seed(model_.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(r) + 1);
      s.tolerated.assign(static_cast<std::size_t>(n), false);
    }
    for (const auto& d : model_.deaths) state(d.rank).dies_at = std::min(state(d.rank).dies_at, d.at);
  }

  const cluster_model& model() const noexcept { return model_; }
  const cluster::topology& topology() const noexcept { return topology_; }
  int size() const noexcept { return model_.size(); }
  rank_state& state(int r) noexcept { return ranks_[static_cast<std::size_t>(r)]; }

  // --- Running the ranks' threads ---------------------------------------------------

  // The thread of rank r starts here: it waits for its first turn. False: the job could
  // not start all its threads, and this one must return without running.
  bool enter(int r) {
    auto& s = state(r);
    s.baton.acquire();
    if (aborted_) return false;
    support::this_thread_virtual_clock() = &s;
    s.cpu_mark = thread_cpu_ns();
    return true;
  }

  // The job could not start its threads: those started return from enter() at once.
  void abort_start(int started) {
    aborted_ = true;
    for (int r = 0; r < started; ++r) state(r).baton.release();
  }

  // Starts the run: every rank is ready at time 0, rank 0 goes first.
  void start() {
    for (int r = 0; r < size(); ++r) {
      state(r).state = rank_state::status::ready;
      schedule(state(r), time_point{});
    }
    pass_baton();
  }

  // Rank r's function returned (failure: it threw, with that cause and reason). Returns
  // whether the rank died as the model said (now, or before it returned).
  bool leave(int r, std::optional<std::pair<errc, std::string>> failure) {
    auto& s = state(r);
    if (!s.died) {
      s.charge_compute();
      if (s.clock >= s.dies_at) die(s);  // it computed past its death without a transport call
    }
    if (!s.died) {
      if (failure)
        lose(r, s.clock, lost_cause(failure->first), failure->second, true);
      else
        lose(r, s.clock, errc::peer_lost, "finished and closed its endpoint at virtual time " + seconds(s.clock), false);
    }
    mailbox_.drop_receives_of(r);  // requests it kept past its return: their buffers may be gone
    s.state = rank_state::status::finished;
    unschedule(s);
    support::this_thread_virtual_clock() = nullptr;
    ++finished_;
    const bool died = s.died;
    pass_baton();  // another rank's turn, or nobody's when all have finished
    return died;
  }

  // Blocks the caller (not a rank) until every rank has left.
  void join_all() { all_done_.acquire(); }

  // --- The transport's operations (on the running rank's thread) ---------------------

  // Rank r begins a transport call that costs it `cpu` (a send's overhead): counts its
  // compute and lets the ranks behind it in virtual time go first.
  void begin_call(int r, duration cpu = {}) {
    auto& s = state(r);
    s.charge_compute();
    s.clock += cpu;
    check_death(s);
    if (behind(s)) {
      s.state = rank_state::status::ready;
      schedule(s, s.clock);
      pass_baton_and_wait(s);
      s.cpu_mark = thread_cpu_ns();
    }
    check_death(s);
  }

  // The transport call is over: the CPU time it took is not the rank's compute.
  void end_call(int r) noexcept { state(r).cpu_mark = thread_cpu_ns(); }

  void post_send(sim_op& op) {
    auto& s = state(op.source);
    s.traffic.sent(op.bytes);
    if (auto d = doom(s, op.destination); d && d->at <= s.clock) {
      op.fail(s.clock, d->cause, d->message);
      return;
    }
    const message_times t = network_.send(op.source, op.destination, op.bytes, s.clock);
    const time_point arrives = mailbox_.in_order(op.source, op.destination, t.arrived);
    op.done = true;
    op.complete_at = t.sent;
    maybe_prune();
    if (state(op.destination).state == rank_state::status::finished) return;  // nobody will receive it
    if (sim_op* recv = mailbox_.take_receive(op.source, op.destination, op.tag)) {
      if (recv->doom_at < arrives) {  // its rank learns its peer is gone before the message comes
        recv->fail(recv->doom_at, recv->doom_cause, recv->doom_message);
        completed(*recv);
      } else {
        deliver(*recv, op.data, op.bytes, arrives, op.source, op.tag);
        return;
      }
    }
    mailbox_.stage(op.source, op.destination, op.tag, op.data, op.bytes, arrives);
  }

  void post_recv(sim_op& op) {
    auto& s = state(op.destination);
    s.traffic.received(op.bytes);
    const bool staged = mailbox_.take_staged(op.source, op.destination, op.tag, [&](const staged_message& m) {
      deliver(op, m.bytes.data(), m.bytes.size(), std::max(m.arrives, s.clock), op.source, op.tag);
    });
    if (staged) return;
    if (auto d = doom(s, op.source)) {
      if (d->at <= s.clock) {
        op.fail(s.clock, d->cause, d->message);
        return;
      }
      op.doom_at = d->at;
      op.doom_cause = d->cause;
      op.doom_message = d->message;
    }
    mailbox_.queue_receive(op);
  }

  // Waits until one of `ops` (null entries skipped) has completed; returns its index. The
  // rank's clock moves to its completion. Throws timeout at the virtual deadline if none
  // was sent by then.
  std::size_t wait_any(int r, std::span<sim_op* const> ops, deadline until) {
    auto& s = state(r);
    begin_call(r);
    const time_point limit = virtual_deadline(s, until);
    for (;;) {
      settle_dooms(ops, s.clock);
      if (auto i = earliest_done(ops); i && ops[*i]->complete_at <= s.clock) return *i;
      if (s.deadlocked) {
        s.deadlocked = false;
        throw error(errc::timeout, "rank " + std::to_string(r) + ": the simulated job is deadlocked at virtual time " +
                                       seconds(s.clock) + ": every rank waits for a message nobody will send (" +
                                       describe_wait(ops) + ")");
      }
      if (!any_done(ops) && s.clock >= limit)
        throw error(errc::timeout, transport::detail::timeout_message(r, describe_wait(ops)) + " (virtual time " +
                                       seconds(s.clock) + ")");
      // Block until the earliest of its known completions, its receives' dooms, its
      // deadline and its death, once every rank behind that time has run.
      s.awaited = ops;
      s.wait_deadline = limit;
      s.state = rank_state::status::waiting;
      const time_point wake = wake_time(s);
      if (wake != never) schedule(s, wake);
      pass_baton_and_wait(s);
      s.awaited = {};
      s.clock = std::max(s.clock, s.agenda_time);
      check_death(s);
    }
  }

  // Waits for one operation (transport::detail::finish_operation's engine.wait) and throws
  // its failure, which names this rank.
  void wait(sim_op& op, deadline until) {
    sim_op* ops[] = {&op};
    const call_end done(*this, op.owner());
    wait_any(op.owner(), ops, until);
    if (op.failure != errc{}) throw error(op.failure, op.failure_message);
  }

  // Withdraws an operation that will not be waited for (its request was dropped): an
  // unmatched receive leaves its queue; a matched one has its message already.
  void cancel(sim_op& op) noexcept {
    if (!op.done && !op.is_send) mailbox_.unqueue_receive(op);
  }

  // The rank failed (concepts::failable_transport): its peers learn it one latency later.
  void fail(int r, errc cause, const std::string& reason) {
    auto& s = state(r);
    s.charge_compute();
    if (s.failed) return;
    s.failed = true;
    lose(r, s.clock, lost_cause(cause), reason, true);
  }

  void tolerate_loss(int r, int peer) { state(r).tolerated.at(static_cast<std::size_t>(peer)) = true; }

  // The peers whose failure rank r knows of by now.
  std::vector<int> lost_peers(int r) {
    auto& s = state(r);
    s.charge_compute();
    std::vector<int> out;
    for (const auto& l : s.lost)
      if (l.failed && l.known_at <= s.clock) out.push_back(l.peer);
    return out;
  }

 private:
  friend struct rank_state;

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

  // When a waiting rank can next make progress: the earliest known completion of what it
  // awaits, else the earliest doom of its receives or its deadline; and its death.
  time_point wake_time(const rank_state& s) const noexcept {
    time_point t = s.died ? never : s.dies_at;
    bool matched = false;
    for (const sim_op* op : s.awaited) {
      if (!op) continue;
      if (op->done) {
        t = std::min(t, op->complete_at);
        matched = true;
      } else {
        t = std::min(t, op->doom_at);
      }
    }
    if (!matched) t = std::min(t, s.wait_deadline);
    return t == never ? never : std::max(t, s.clock);
  }

  // Something a rank awaits changed (an operation completed, a receive was doomed): it
  // may wake earlier.
  void reschedule_if_waiting(int r) {
    auto& s = state(r);
    if (s.state != rank_state::status::waiting) return;
    const time_point wake = wake_time(s);
    if (wake != never && (!s.in_agenda || wake < s.agenda_time)) schedule(s, wake);
  }
  void completed(sim_op& op) { reschedule_if_waiting(op.owner()); }

  // Receives whose rank has learnt by `now` that nothing will match them fail.
  void settle_dooms(std::span<sim_op* const> ops, time_point now) {
    for (sim_op* op : ops)
      if (op && !op->done && op->doom_at <= now) {
        mailbox_.unqueue_receive(*op);
        op->fail(op->doom_at, op->doom_cause, op->doom_message);
      }
  }

  void check_death(rank_state& s) {
    if (!s.died && s.clock >= s.dies_at) die(s);
    if (s.died) throw rank_died{s.rank, s.dies_at};
  }

  // The model's die=RANK@TIME: the rank is lost at that time, as if it had failed.
  void die(rank_state& s) {
    s.clock = s.dies_at;
    s.died = s.failed = true;
    lose(s.rank, s.dies_at, errc::peer_lost,
         "it died at virtual time " + seconds(s.dies_at) + " (the cluster model's die=" + std::to_string(s.rank) + "@...)",
         true);
  }

  // What the peers of a rank that failed with `cause` report: a mismatch stays one (so
  // every rank names the disagreement), anything else is a lost peer.
  static errc lost_cause(errc cause) noexcept { return cause == errc::mismatch ? errc::mismatch : errc::peer_lost; }

  static time_point virtual_deadline(const rank_state& s, deadline until) noexcept {
    if (until == deadline::max()) return never;
    return std::max(s.clock, time_point(std::chrono::duration_cast<duration>(until.time_since_epoch())));
  }

  static std::optional<std::size_t> earliest_done(std::span<sim_op* const> ops) noexcept {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i] && ops[i]->done && (!best || ops[i]->complete_at < ops[*best]->complete_at)) best = i;
    return best;
  }
  static bool any_done(std::span<sim_op* const> ops) noexcept {
    return std::any_of(ops.begin(), ops.end(), [](const sim_op* op) { return op && op->done; });
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
    return out.empty() ? "nothing" : out;
  }

  // --- Messages and losses -----------------------------------------------------------

  // A receive gets its message, which arrives at `arrives`; a size that differs fails the
  // receive (the sender's send, eager, has completed: it learns when the receiver fails).
  void deliver(sim_op& recv, const std::byte* bytes, std::size_t size, time_point arrives, int sender,
               std::uint64_t tag) {
    const time_point done = arrives + model_.overhead;
    if (size != recv.bytes) {
      recv.fail(done, errc::mismatch,
                "rank " + std::to_string(recv.destination) + ": " +
                    transport::detail::size_mismatch_message(sender, size, tag, recv.destination, recv.bytes));
    } else {
      if (size) recv.deliver(recv.data, bytes, size);
      recv.done = true;
      recv.complete_at = done;
    }
    completed(recv);
  }

  struct doom_info {
    time_point at;
    errc cause;
    std::string message;
  };

  // When operations of s with `peer` stop being possible, as s learns it: the peer is gone
  // (it failed or closed), or another rank failed whose loss s does not tolerate.
  std::optional<doom_info> doom(const rank_state& s, int peer) const {
    const peer_loss* first = nullptr;
    for (const auto& l : s.lost) {
      const bool matters = l.peer == peer || (l.failed && !s.tolerated[static_cast<std::size_t>(l.peer)]);
      if (matters && (!first || l.known_at < first->known_at)) first = &l;
    }
    if (!first) return std::nullopt;
    const bool tolerated = s.tolerated[static_cast<std::size_t>(first->peer)];
    std::string message =
        !first->failed ? "rank " + std::to_string(s.rank) + ": rank " + std::to_string(first->peer) + " " + first->reason
        : tolerated    ? transport::detail::tolerated_peer_failed_message(s.rank, first->peer, first->reason)
                       : transport::detail::peer_failed_message(s.rank, first->peer, first->reason);
    return doom_info{first->known_at, first->failed ? first->cause : errc::peer_lost, std::move(message)};
  }

  // Rank r is gone at `at`: every other rank learns it one latency later; their queued
  // receives that nothing may match after that are doomed then.
  void lose(int r, time_point at, errc cause, const std::string& reason, bool failed) {
    for (int q = 0; q < size(); ++q) {
      if (q == r) continue;
      auto& s = state(q);
      if (s.state == rank_state::status::finished || s.loss_of(r)) continue;
      s.lost.push_back({r, at + model_.link_between(r, q).latency, cause, reason, failed});
      mailbox_.for_each_receive_of(q, [&](sim_op& op) {
        if (auto d = doom(s, op.source); d && d->at < op.doom_at) {
          op.doom_at = d->at;
          op.doom_cause = d->cause;
          op.doom_message = std::move(d->message);
        }
      });
      reschedule_if_waiting(q);
    }
  }

  // Every prune_every messages, links forget reservations that end before any rank's
  // clock: no message can be sent before that.
  void maybe_prune() {
    if (!network_.wants_pruning()) return;
    time_point horizon = never;
    for (auto& s : ranks_)
      if (s.state != rank_state::status::finished)
        horizon = std::min(horizon, s.in_background ? std::min(s.clock, s.caller_clock) : s.clock);
    if (horizon != never) network_.forget_before(horizon);
  }

  const cluster_model model_;
  const cluster::topology topology_;  // the modelled hosts, as every endpoint reports them
  network network_;
  mailbox mailbox_;
  std::vector<rank_state> ranks_;
  std::set<std::pair<time_point, int>> agenda_;  // (when, rank): who goes next
  int finished_ = 0;
  bool aborted_ = false;
  std::binary_semaphore all_done_{0};
};

inline call_end::~call_end() { s.end_call(rank); }

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
  caller_clock = clock;
  in_background = true;
  clock = std::max(clock, background_end);
  auto back = [&] {
    background_end = clock;
    clock = caller_clock;
    in_background = false;
  };
  try {
    work(context);
  } catch (...) {
    back();
    throw;
  }
  charge_compute();
  back();
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
