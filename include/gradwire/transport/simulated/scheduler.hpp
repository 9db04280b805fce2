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
// Deadlines are virtual: a simulated rank's endpoint hands out its virtual clock as its
// time (clock.hpp's time_source; concepts::timed_transport), so the communicator's and
// the parameter server's deadlines count from it. A deadline bounds the wait for a peer
// to send; a message already on its way is received when it arrives.
//
// Losses. A rank that throws, fails (concepts::failable_transport) or dies (the model's
// die=RANK@TIME) is lost: every other rank learns it one latency later. From then on its
// operations with the lost rank fail with peer_lost, and, unless it tolerates that loss,
// all of its operations do, as on the network transports; a receive posted before then
// fails then, unless its message arrives first. A rank that returns closes its endpoint:
// receives from it that nothing will match fail the same way.
//
// Replacements. The model's restart=RANK@TIME starts a dead rank's function again at TIME,
// as a replacement process (its endpoint's rejoined() is true). It says hello to every
// peer then: one that allowed that rank back (allow_rejoin) takes it back one latency
// later, dropping what the dead process sent that nobody received; from then on their
// operations go through again. Receives such a peer posts from the lost rank meanwhile
// wait for the replacement. A peer that did not allow it is absent to the replacement.
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
#include <thread>
#include <utility>
#include <vector>

#include <time.h>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../support/traffic.hpp"
#include "../../clock.hpp"
#include "../../timeouts.hpp"
#include "../detail/messages.hpp"
#include "../detail/failure.hpp"
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
  time_point back_at = never;  // when this rank learns it took the peer's replacement back
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
struct rank_state;

// The lane of the calling thread (null on threads that are no simulated rank's).
inline rank_state*& this_thread_rank() noexcept {
  thread_local rank_state* lane = nullptr;
  return lane;
}

// Ends a transport call of a rank however it leaves (scheduler::end_call).
struct call_end {
  scheduler& s;
  int rank;
  ~call_end();
};

// One virtual thread, a lane: a rank's own (its main lane: the thread its function runs on),
// or the second thread a rank started (virtual_time::start_thread; K of N's communicator
// thread). A lane has its clocks, its baton and what it waits for; what a rank knows of
// lost peers, its death, speed and traffic are its main lane's (home()).
struct rank_state final : virtual_time {
  enum class status : std::uint8_t { idle, running, ready, waiting, finished };

  scheduler* owner = nullptr;
  int rank = 0;
  int lane = 0;                  // its id in the agenda: the rank, or size() + rank for a second thread
  rank_state* main = nullptr;    // a second thread's rank (null: this is the rank's main lane)
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
  // Between a rank's lanes (virtual_time::wait_signal, join_thread).
  bool waits_signal = false;
  bool signalled = false;  // another lane of its rank signalled, and it has not looked since
  time_point signal_at{};  // when the latest such signal was given
  bool joining = false;  // the main lane waits for its second thread to return
  bool signal_ends_waits = false;  // virtual_time::waits_end_on_signal
  std::thread thread;    // a second thread's
  // Peers: which losses it tolerates and the peers it knows are gone (few: a list).
  std::vector<bool> tolerated;
  std::vector<bool> rejoinable;  // peers whose replacement it takes back (allow_rejoin)
  std::vector<peer_loss> lost;
  bool rejoined = false;  // this incarnation replaces the rank (restart=)
  bool failed = false;  // this rank failed (fail(), an exception, a death)
  support::traffic_counters traffic;

  rank_state& home() noexcept { return main ? *main : *this; }
  const rank_state& home() const noexcept { return main ? *main : *this; }

  // The virtual clock a rank's endpoint hands out is its main lane's; called on another
  // lane's thread, each acts on that lane (scheduler::lane_of).
  std::int64_t now_ns() override;
  std::int64_t run_in_background(void (*work)(void*), void* context) override;
  void advance_to(std::int64_t ns) override;
  void step_began() override;
  void start_thread(void (*work)(void*), void* context) override;
  void join_thread() noexcept override;
  void yield() override;
  bool wait_signal(std::int64_t until_ns) override;
  void signal() override;
  void waits_end_on_signal(bool on) override;

  // Counts the compute since the last transport call into the clock.
  void charge_compute();
  duration stretched(duration d) const noexcept {
    return duration(static_cast<std::int64_t>(double(d.count()) * home().fixed_factor * home().step_factor));
  }
  const peer_loss* loss_of(int peer) const noexcept {
    for (const auto& l : lost)
      if (l.peer == peer) return &l;
    return nullptr;
  }
};

class scheduler {
 public:
  GRADWIRE_DECL explicit scheduler(cluster_model model);
  GRADWIRE_DECL ~scheduler();  // joins the second threads' OS threads (their lanes have returned)
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  const cluster_model& model() const noexcept { return model_; }
  const cluster::topology& topology() const noexcept { return topology_; }
  int size() const noexcept { return model_.size(); }
  // Rank r's main lane.
  rank_state& state(int r) noexcept { return ranks_[static_cast<std::size_t>(r)]; }
  // The lane of rank r that is running: the calling thread's when it is one of r's, else r's main lane.
  rank_state& lane_of(int r) noexcept {
    rank_state* t = this_thread_rank();
    return t && t->owner == this && t->rank == r ? *t : state(r);
  }

  // --- Running the ranks' threads ---------------------------------------------------

  // The thread of rank r starts here: it waits for its first turn. False: the job could
  // not start all its threads, and this one must return without running.
  GRADWIRE_DECL bool enter(int r);

  // The job could not start its threads: those started return from enter() at once.
  GRADWIRE_DECL void abort_start(int started);

  // Starts the run: every rank is ready at time 0, rank 0 goes first.
  GRADWIRE_DECL void start();

  // Rank r's function returned (failure: it threw, with that cause and reason). Returns
  // whether the rank died as the model said (now, or before it returned).
  GRADWIRE_DECL bool leave(int r, std::optional<transport::detail::rank_failure> failure);

  // Blocks the caller (not a rank) until every rank has left.
  void join_all() { all_done_.acquire(); }

  // --- The transport's operations (on the running rank's thread) ---------------------

  // Rank r begins a transport call that costs it `cpu` (a send's overhead): counts its
  // compute and lets the ranks behind it in virtual time go first.
  GRADWIRE_DECL void begin_call(int r, duration cpu = {});

  // The transport call is over: the CPU time it took is not the rank's compute.
  void end_call(int r) noexcept { lane_of(r).cpu_mark = thread_cpu_ns(); }

  GRADWIRE_DECL void post_send(sim_op& op);

  GRADWIRE_DECL void post_recv(sim_op& op);

  // Waits until one of `ops` (null entries skipped) has completed; returns its index. The
  // rank's clock moves to its completion. Throws timeout at the virtual deadline if none
  // was sent by then.
  GRADWIRE_DECL std::size_t wait_any(int r, std::span<sim_op* const> ops, deadline until);

  // Waits for one operation (transport::detail::finish_operation's engine.wait) and throws
  // its failure, which names this rank.
  GRADWIRE_DECL void wait(sim_op& op, deadline until);

  // Withdraws an operation that will not be waited for (its request was dropped): an
  // unmatched receive leaves its queue; a matched one has its message already.
  void cancel(sim_op& op) noexcept {
    if (!op.done && !op.is_send) mailbox_.unqueue_receive(op);
  }

  // The rank failed (concepts::failable_transport): its peers learn it one latency later.
  GRADWIRE_DECL void fail(int r, errc cause, const std::string& reason);

  void tolerate_loss(int r, int peer) { state(r).tolerated.at(static_cast<std::size_t>(peer)) = true; }
  void allow_rejoin(int r, int peer) {
    tolerate_loss(r, peer);
    state(r).rejoinable.at(static_cast<std::size_t>(peer)) = true;
  }

  // Rank r's function ended with its death: when the model restarts it, the replacement
  // starts at that time (its hello taken as above) and this returns true once it is its
  // turn: run the function again. False: no restart, the rank leaves.
  GRADWIRE_DECL bool restart(int r);

  // The peers whose failure rank r knows of by now.
  GRADWIRE_DECL std::vector<int> lost_peers(int r);

  // --- A rank's second thread (virtual_time::start_thread and what goes with it) ------

  GRADWIRE_DECL void start_thread(int r, void (*work)(void*), void* context);
  GRADWIRE_DECL void join_thread(int r) noexcept;
  // Waits on rank r's running lane until another lane of r signals, or until `until`.
  GRADWIRE_DECL bool wait_signal(int r, time_point until);
  GRADWIRE_DECL void signal(int r);

 private:
  friend struct rank_state;

  // --- Turn-taking -------------------------------------------------------------------

  GRADWIRE_DECL void schedule(rank_state& s, time_point at);
  GRADWIRE_DECL void unschedule(rank_state& s);

  // Whether another lane must go before s: it is scheduled earlier (or as early, lower lane).
  bool behind(const rank_state& s) const noexcept {
    return !agenda_.empty() && *agenda_.begin() < std::pair<time_point, int>(s.clock, s.lane);
  }
  // The lane with agenda id `lane`.
  rank_state& by_lane(int lane) noexcept {
    return lane < size() ? state(lane) : *helpers_[static_cast<std::size_t>(lane - size())];
  }
  // Rank r's second lane, while one is started and has not returned (else null).
  rank_state* live_helper(int r) noexcept {
    rank_state* h = helpers_[static_cast<std::size_t>(r)].get();
    return h && h->state != rank_state::status::finished ? h : nullptr;
  }
  // A second lane's work returned (or threw): it leaves the agenda, and its rank's main
  // lane, when it waits to join it, goes on at its time.
  GRADWIRE_DECL void finish_helper(rank_state& h);

  // The lane to go next: first in the agenda. When the agenda is empty but lanes still
  // wait (with no deadline), nobody can make progress: the lowest of them is woken to
  // report the deadlock. -1: every rank has finished.
  GRADWIRE_DECL int next_lane();

  // Hands the baton on (to nobody when all have finished: the run is over).
  GRADWIRE_DECL void pass_baton();

  // Hands the baton on and waits for it to come back (at once when s goes next itself).
  GRADWIRE_DECL void pass_baton_and_wait(rank_state& s);

  // When a waiting rank can next make progress: the earliest known completion of what it
  // awaits, else the earliest doom of its receives or its deadline; and its death.
  time_point wake_time(const rank_state& s) const noexcept {
    time_point t = s.home().dies_at;  // a lane wakes at its rank's death, whichever lane died first
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

  // Something a rank awaits changed (an operation completed, a receive was doomed, its
  // other lane died): its waiting lanes may wake earlier.
  GRADWIRE_DECL void reschedule_if_waiting(int r);
  void completed(sim_op& op) { reschedule_if_waiting(op.owner()); }

  // Receives whose rank has learnt by `now` that nothing will match them fail.
  GRADWIRE_DECL void settle_dooms(std::span<sim_op* const> ops, time_point now);

  GRADWIRE_DECL void check_death(rank_state& s);

  // The model's die=RANK@TIME: the rank is lost at that time, as if it had failed.
  GRADWIRE_DECL void die(rank_state& s);

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

  GRADWIRE_DECL static std::string describe_wait(std::span<sim_op* const> ops);

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
  // (it failed or closed), or another rank failed whose loss s does not tolerate. A loss
  // whose replacement s took back by `now` no longer counts; nor, for a receive posted at
  // `now` once s knew of the loss, that of a peer whose replacement s would take back (it
  // waits for it).
  GRADWIRE_DECL std::optional<doom_info> doom(const rank_state& s, int peer, time_point now, bool receive) const;
  // What an operation with s's peers fails with, because of loss `l`.
  GRADWIRE_DECL doom_info describe_loss(const rank_state& s, const peer_loss& l) const;

  // The first death of rank r the model sets after `after`.
  time_point next_death(int r, time_point after) const noexcept {
    time_point t = never;
    for (const auto& d : model_.deaths)
      if (d.rank == r && d.at > after) t = std::min(t, d.at);
    return t;
  }

  // Rank r is gone at `at`: every other rank learns it one latency later; their queued
  // receives that nothing may match after that are doomed then.
  GRADWIRE_DECL void lose(int r, time_point at, errc cause, const std::string& reason, bool failed);

  // Every prune_every messages, links forget reservations that end before any rank's
  // clock: no message can be sent before that.
  GRADWIRE_DECL void maybe_prune();

  const cluster_model model_;
  const cluster::topology topology_;  // the modelled hosts, as every endpoint reports them
  network network_;
  mailbox mailbox_;
  std::vector<rank_state> ranks_;
  std::vector<std::unique_ptr<rank_state>> helpers_;  // [rank]: its second lane, made at its first start_thread
  std::set<std::pair<time_point, int>> agenda_;  // (when, rank): who goes next
  int finished_ = 0;
  bool aborted_ = false;
  std::binary_semaphore all_done_{0};
};

}  // namespace detail
}  // namespace gradwire::simulation

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "scheduler.ipp"
#endif
