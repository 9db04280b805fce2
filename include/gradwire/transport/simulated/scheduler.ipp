// Definitions of scheduler.hpp: the virtual-time scheduler's turns, messages, waits and deaths. Compiled
// once in src/core.cpp, or included by scheduler.hpp in header-only mode (config.hpp).
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "scheduler.hpp"

namespace gradwire::simulation::detail {

GRADWIRE_DECL scheduler::scheduler(cluster_model model)
  : model_((model.validate(), std::move(model))),
      topology_(model_.topology()),
      network_(model_),
      mailbox_(model_.size()),
      ranks_(static_cast<std::size_t>(model_.size())),
      helpers_(static_cast<std::size_t>(model_.size())) {
  const int n = model_.size();
  for (int r = 0; r < n; ++r) {
    auto& s = state(r);
    s.owner = this;
    s.rank = r;
    s.lane = r;
    s.fixed_factor = model_.speed * model_.stragglers.fixed_factor(r);
    s.rng.seed(model_.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(r) + 1);
    s.tolerated.assign(static_cast<std::size_t>(n), false);
    s.rejoinable.assign(static_cast<std::size_t>(n), false);
  }
  for (const auto& d : model_.deaths) state(d.rank).dies_at = std::min(state(d.rank).dies_at, d.at);
}

GRADWIRE_DECL scheduler::~scheduler() {
  for (auto& h : helpers_)
    if (h && h->thread.joinable()) {
      if (h->thread.get_id() == std::this_thread::get_id()) h->thread.detach();  // its own last reference
      else h->thread.join();
    }
}

GRADWIRE_DECL bool scheduler::enter(int r) {
  auto& s = state(r);
  s.baton.acquire();
  if (aborted_) return false;
  s.cpu_mark = thread_cpu_ns();
  return true;
}

GRADWIRE_DECL void scheduler::abort_start(int started) {
  aborted_ = true;
  for (int r = 0; r < started; ++r) state(r).baton.release();
}

GRADWIRE_DECL void scheduler::start() {
  for (int r = 0; r < size(); ++r) {
    state(r).state = rank_state::status::ready;
    schedule(state(r), time_point{});
  }
  pass_baton();
}

GRADWIRE_DECL bool scheduler::leave(int r, std::optional<transport::detail::rank_failure> failure) {
  auto& s = state(r);
  join_thread(r);  // its second thread's work may refer to what the rank's function owned
  if (!s.died) {
    s.charge_compute();
    if (s.clock >= s.dies_at) die(s);  // it computed past its death without a transport call
  }
  if (!s.died) {
    if (failure)
      lose(r, s.clock, transport::detail::peer_failure_kind(failure->cause), failure->reason, true);
    else
      lose(r, s.clock, errc::peer_lost, "said goodbye at virtual time " + seconds(s.clock), false);
  }
  mailbox_.drop_receives_of(r);  // requests it kept past its return: their buffers may be gone
  s.state = rank_state::status::finished;
  unschedule(s);
  ++finished_;
  const bool died = s.died;
  pass_baton();  // another rank's turn, or nobody's when all have finished
  return died;
}

GRADWIRE_DECL bool scheduler::restart(int r) {
  auto& s = state(r);
  join_thread(r);
  time_point at = never;
  for (const auto& x : model_.restarts)
    if (x.rank == r && x.at >= s.dies_at && x.at < at) at = x.at;
  if (at == never || !s.died) return false;
  // The dead process's receives (their buffers are gone) and the messages sent to it go.
  mailbox_.drop_receives_of(r);
  for (int q = 0; q < size(); ++q) mailbox_.drop_staged(q, r);
  // A new process, from `at`: no tolerance or replacement it allows yet, its own traffic.
  s.clock = s.background_end = at;
  s.in_background = false;
  s.step_factor = 1;
  s.died = s.failed = s.deadlocked = false;
  s.dies_at = next_death(r, at);
  s.tolerated.assign(s.tolerated.size(), false);
  s.rejoinable.assign(s.rejoinable.size(), false);
  s.traffic = {};
  s.lost.clear();  // what it finds at its hello, below
  s.signalled = false;
  s.signal_at = {};
  s.rejoined = true;
  s.state = rank_state::status::ready;
  schedule(s, at);
  pass_baton_and_wait(s);
  s.cpu_mark = thread_cpu_ns();
  // Its hello: each peer that allowed it back takes it back one latency later and drops
  // what the dead process sent it unread; to the others it is absent.
  for (int q = 0; q < size(); ++q) {
    if (q == r) continue;
    auto& p = state(q);
    const time_point back = at + model_.link_between(r, q).latency;
    peer_loss* l = nullptr;
    for (auto& x : p.lost)
      if (x.peer == r) l = &x;
    const bool gone = p.state == rank_state::status::finished || p.died;
    if (!gone && p.rejoinable[static_cast<std::size_t>(r)] && l && l->back_at == never) {
      l->back_at = back;
      mailbox_.drop_staged(r, q);
      reschedule_if_waiting(q);
      continue;
    }
    s.tolerated[static_cast<std::size_t>(q)] = true;  // absent, as a network replacement's unlinked peers: only
                                                       // operations with it fail
    s.lost.push_back({q, at, errc::peer_lost,
                      p.state == rank_state::status::finished ? "it has finished"
                      : p.died                                ? "it died (the cluster model's die=" + std::to_string(q) + "@...)"
                                                              : "it did not take this replacement back (it allows no "
                                                                "rejoin of rank " + std::to_string(r) + " now)",
                      p.state != rank_state::status::finished});
  }
  return true;
}

GRADWIRE_DECL void scheduler::begin_call(int r, duration cpu) {
  auto& s = lane_of(r);
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

GRADWIRE_DECL void scheduler::post_send(sim_op& op) {
  auto& s = lane_of(op.source);
  s.home().traffic.sent(op.bytes);
  if (auto d = doom(s.home(), op.destination, s.clock, false); d && d->at <= s.clock) {
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

GRADWIRE_DECL void scheduler::post_recv(sim_op& op) {
  auto& s = lane_of(op.destination);
  s.home().traffic.received(op.bytes);
  // One posted once the loss of a peer it takes back is known waits for the replacement: what
  // the dead process left staged is not for it (the hello drops it).
  const rank_state& h = s.home();
  const peer_loss* gone = h.loss_of(op.source);
  const bool awaits_replacement = gone && h.rejoinable[static_cast<std::size_t>(op.source)] &&
                                  gone->known_at <= s.clock && s.clock < gone->back_at;
  const bool staged = !awaits_replacement && mailbox_.take_staged(op.source, op.destination, op.tag, [&](const staged_message& m) {
    deliver(op, m.bytes.data(), m.bytes.size(), std::max(m.arrives, s.clock), op.source, op.tag);
  });
  if (staged) return;
  if (auto d = doom(s.home(), op.source, s.clock, true)) {
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

GRADWIRE_DECL std::size_t scheduler::wait_any(int r, std::span<sim_op* const> ops, deadline until) {
  auto& s = lane_of(r);
  begin_call(r);
  const time_point limit = virtual_deadline(s, until);
  for (;;) {
    settle_dooms(ops, s.clock);
    if (auto i = earliest_done(ops); i && ops[*i]->complete_at <= s.clock) return *i;
    if (s.signal_ends_waits && std::exchange(s.signalled, false)) {  // another thread of its rank signalled
      s.clock = std::max(s.clock, s.signal_at);
      throw error(errc::timeout, "rank " + std::to_string(r) + ": a wait ended by another thread of its rank (virtual time " +
                                     seconds(s.clock) + ")");
    }
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

GRADWIRE_DECL void scheduler::wait(sim_op& op, deadline until) {
  sim_op* ops[] = {&op};
  const call_end done(*this, op.owner());
  wait_any(op.owner(), ops, until);
  if (op.failure != errc{}) throw error(op.failure, op.failure_message);
}

GRADWIRE_DECL void scheduler::fail(int r, errc cause, const std::string& reason) {
  auto& s = lane_of(r);
  s.charge_compute();
  if (s.home().failed) return;
  s.home().failed = true;
  lose(r, s.clock, transport::detail::peer_failure_kind(cause), reason, true);  // every transport's rule
}

GRADWIRE_DECL std::vector<int> scheduler::lost_peers(int r) {
  auto& s = lane_of(r);
  s.charge_compute();
  std::vector<int> out;
  for (const auto& l : s.home().lost)
    if (l.failed && l.known_at <= s.clock && s.clock < l.back_at) out.push_back(l.peer);
  return out;
}

GRADWIRE_DECL void scheduler::start_thread(int r, void (*work)(void*), void* context) {
  auto& m = lane_of(r);
  if (m.main)
    throw error(errc::invalid_argument, "simulation: rank " + std::to_string(r) +
                                            "'s second thread cannot start a thread (one per rank, started by its main thread)");
  if (live_helper(r))
    throw error(errc::invalid_argument, "simulation: rank " + std::to_string(r) +
                                            " started a second thread while its last one runs (join_thread first)");
  m.charge_compute();
  check_death(m);
  auto& slot = helpers_[static_cast<std::size_t>(r)];
  if (!slot) {
    slot = std::make_unique<rank_state>();
    slot->owner = this;
    slot->rank = r;
    slot->lane = size() + r;
    slot->main = &m;
  }
  rank_state& h = *slot;
  if (h.thread.joinable()) h.thread.join();  // the last one returned: its thread is ending
  h.clock = m.clock;
  h.background_end = m.clock;
  h.in_background = false;
  h.deadlocked = h.waits_signal = h.signalled = h.joining = h.signal_ends_waits = false;
  h.signal_at = {};
  h.state = rank_state::status::ready;
  schedule(h, h.clock);
  try {
    h.thread = std::thread([this, &h, work, context] {
      h.baton.acquire();
      this_thread_rank() = &h;
      h.cpu_mark = thread_cpu_ns();
      try {
        work(context);
      } catch (...) {  // the work reports its own failures (K of N's job keeps them for its caller)
      }
      this_thread_rank() = nullptr;
      finish_helper(h);
    });
  } catch (...) {
    unschedule(h);
    h.state = rank_state::status::finished;
    throw;
  }
}

GRADWIRE_DECL void scheduler::finish_helper(rank_state& h) {
  if (!h.home().died) h.charge_compute();
  h.state = rank_state::status::finished;
  unschedule(h);
  rank_state& m = *h.main;
  if (m.joining) {
    m.joining = false;
    m.state = rank_state::status::ready;
    schedule(m, std::max(m.clock, h.clock));
  }
  pass_baton();
}

GRADWIRE_DECL void scheduler::join_thread(int r) noexcept {
  rank_state& m = state(r);
  if (!live_helper(r)) return;
  // A noexcept wait for the second lane to return: no death check (the rank may be
  // unwinding from its own: the lane's waits end at that death too, wake_time), no
  // deadline (the lane's own waits have theirs).
  m.joining = true;
  m.state = rank_state::status::waiting;
  unschedule(m);
  pass_baton_and_wait(m);
  m.clock = std::max(m.clock, m.agenda_time);
  m.cpu_mark = thread_cpu_ns();
}

GRADWIRE_DECL bool scheduler::wait_signal(int r, time_point until) {
  auto& s = lane_of(r);
  s.charge_compute();
  check_death(s);
  if (std::exchange(s.signalled, false)) {  // signalled since it last looked: nothing to wait for
    s.clock = std::max(s.clock, s.signal_at);
    return true;
  }
  if (s.clock >= until) return false;
  s.awaited = {};
  s.wait_deadline = until;
  s.waits_signal = true;
  s.state = rank_state::status::waiting;
  const time_point wake = wake_time(s);
  if (wake != never) schedule(s, wake);
  pass_baton_and_wait(s);
  s.waits_signal = false;
  s.clock = std::max(s.clock, s.agenda_time);
  s.cpu_mark = thread_cpu_ns();
  if (s.deadlocked) {
    s.deadlocked = false;
    throw error(errc::timeout, "rank " + std::to_string(r) + ": the simulated job is deadlocked at virtual time " +
                                   seconds(s.clock) + ": every rank waits for a message nobody will send (and " +
                                   "this thread for another of its rank's)");
  }
  check_death(s);
  return std::exchange(s.signalled, false);
}

GRADWIRE_DECL void scheduler::signal(int r) {
  auto& s = lane_of(r);
  s.charge_compute();
  // Kept until the other lane looks (wait_signal, or a wait that signals end): one that is
  // not waiting yet (it gave its turn up on its way there) must not miss it.
  for (rank_state* other : {&state(r), live_helper(r)}) {
    if (!other || other == &s) continue;
    other->signalled = true;
    other->signal_at = std::max(other->signal_at, s.clock);
    if (other->state == rank_state::status::waiting &&
        (other->waits_signal || (other->signal_ends_waits && !other->joining))) {
      const time_point at = std::max(other->clock, s.clock);
      if (!other->in_agenda || at < other->agenda_time) schedule(*other, at);
    }
  }
}

GRADWIRE_DECL void scheduler::schedule(rank_state& s, time_point at) {
  unschedule(s);
  s.agenda_entry = agenda_.emplace(at, s.lane).first;
  s.in_agenda = true;
  s.agenda_time = at;
}

GRADWIRE_DECL void scheduler::unschedule(rank_state& s) {
  if (!s.in_agenda) return;
  agenda_.erase(s.agenda_entry);
  s.in_agenda = false;
}

GRADWIRE_DECL int scheduler::next_lane() {
  if (agenda_.empty()) {
    // A lane joining its second thread is not stuck by itself: that thread is.
    auto stuck = [](const rank_state& w) { return w.state == rank_state::status::waiting && !w.joining; };
    rank_state* w = nullptr;
    for (auto& m : ranks_)
      if (stuck(m)) {
        w = &m;
        break;
      }
    if (!w)
      for (auto& h : helpers_)
        if (h && stuck(*h)) {
          w = h.get();
          break;
        }
    if (w) {
      w->deadlocked = true;
      schedule(*w, w->clock);
    }
    if (agenda_.empty()) return -1;
  }
  const int next = agenda_.begin()->second;
  auto& n = by_lane(next);
  unschedule(n);
  n.state = rank_state::status::running;
  return next;
}

GRADWIRE_DECL void scheduler::pass_baton() {
  const int next = next_lane();
  if (next >= 0) by_lane(next).baton.release();
  else if (finished_ == size()) all_done_.release();
}

GRADWIRE_DECL void scheduler::pass_baton_and_wait(rank_state& s) {
  const int next = next_lane();
  if (next == s.lane) return;
  if (next >= 0) by_lane(next).baton.release();
  s.baton.acquire();
}

GRADWIRE_DECL void scheduler::reschedule_if_waiting(int r) {
  for (rank_state* s : {&state(r), live_helper(r)}) {
    if (!s || s->state != rank_state::status::waiting || s->joining) continue;
    const time_point wake = wake_time(*s);
    if (wake != never && (!s->in_agenda || wake < s->agenda_time)) schedule(*s, wake);
  }
}

GRADWIRE_DECL void scheduler::settle_dooms(std::span<sim_op* const> ops, time_point now) {
  for (sim_op* op : ops)
    if (op && !op->done && op->doom_at <= now) {
      mailbox_.unqueue_receive(*op);
      op->fail(op->doom_at, op->doom_cause, op->doom_message);
    }
}

GRADWIRE_DECL void scheduler::check_death(rank_state& s) {
  // Each lane dies when its own clock reaches the death: a lane behind it still has the
  // work before it to do, whichever lane reached it first.
  rank_state& h = s.home();
  if (s.clock < h.dies_at) return;
  if (!h.died) die(s);
  s.clock = h.dies_at;
  throw rank_died{s.rank, h.dies_at};
}

GRADWIRE_DECL void scheduler::die(rank_state& s) {
  rank_state& h = s.home();
  s.clock = h.dies_at;
  h.died = h.failed = true;
  lose(s.rank, h.dies_at, errc::peer_lost,
       "it died at virtual time " + seconds(h.dies_at) + " (the cluster model's die=" + std::to_string(s.rank) + "@...)",
       true);
}

GRADWIRE_DECL std::string scheduler::describe_wait(std::span<sim_op* const> ops) {
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

GRADWIRE_DECL std::optional<scheduler::doom_info> scheduler::doom(const rank_state& s, int peer, time_point now,
                                                                  bool receive) const {
  const peer_loss* first = nullptr;
  for (const auto& l : s.lost) {
    if (l.back_at <= now) continue;  // its replacement is linked
    // Posted once the loss was known, from a peer whose replacement it takes back: it waits
    // for the replacement (a receive posted before, as on a network, fails with the loss).
    const bool waits_for_replacement =
        receive && l.peer == peer && s.rejoinable[static_cast<std::size_t>(peer)] && l.known_at <= now;
    const bool matters = (l.peer == peer && !waits_for_replacement) ||
                         (l.failed && !s.tolerated[static_cast<std::size_t>(l.peer)]);
    if (matters && (!first || l.known_at < first->known_at)) first = &l;
  }
  if (!first) return std::nullopt;
  return describe_loss(s, *first);
}

GRADWIRE_DECL scheduler::doom_info scheduler::describe_loss(const rank_state& s, const peer_loss& l) const {
  const bool tolerated = s.tolerated[static_cast<std::size_t>(l.peer)];
  std::string message = !l.failed   ? transport::detail::finished_message(s.rank, l.peer, l.reason)
                        : tolerated ? transport::detail::tolerated_peer_failed_message(s.rank, l.peer, l.reason)
                                    : transport::detail::peer_failed_message(s.rank, l.peer, l.reason);
  // A tolerated peer's failure fails only the operations with it, with peer_lost, as over
  // tcp and ucx (isolate); an untolerated one's kind follows peer_failure_kind (lose()).
  return doom_info{l.known_at, l.failed && !tolerated ? l.cause : errc::peer_lost, std::move(message)};
}

GRADWIRE_DECL void scheduler::lose(int r, time_point at, errc cause, const std::string& reason, bool failed) {
  for (int q = 0; q < size(); ++q) {
    if (q == r) continue;
    auto& s = state(q);
    if (s.state == rank_state::status::finished) continue;
    if (const peer_loss* known = s.loss_of(r)) {
      if (known->back_at == never) continue;  // it knows already
      std::erase_if(s.lost, [&](const peer_loss& l) { return l.peer == r; });  // a replacement, lost in turn
    }
    s.lost.push_back({r, at + model_.link_between(r, q).latency, cause, reason, failed});
    // The new loss dooms the receives posted before it that it concerns: those from r, and
    // all of them when s does not tolerate it. (Others keep their dooms: one waiting for
    // a replacement of another lost rank goes on waiting.)
    const peer_loss& loss = s.lost.back();
    const bool fails_all = failed && !s.tolerated[static_cast<std::size_t>(r)];
    mailbox_.for_each_receive_of(q, [&](sim_op& op) {
      if (op.source != r && !fails_all) return;
      if (loss.known_at < op.doom_at) {
        doom_info d = describe_loss(s, loss);
        op.doom_at = d.at;
        op.doom_cause = d.cause;
        op.doom_message = std::move(d.message);
      }
    });
    reschedule_if_waiting(q);
  }
}

GRADWIRE_DECL void scheduler::maybe_prune() {
  if (!network_.wants_pruning()) return;
  time_point horizon = never;
  auto bound = [&](const rank_state& s) {
    if (s.state != rank_state::status::finished)
      horizon = std::min(horizon, s.in_background ? std::min(s.clock, s.caller_clock) : s.clock);
  };
  for (auto& s : ranks_) bound(s);
  for (auto& h : helpers_)
    if (h) bound(*h);
  if (horizon != never) network_.forget_before(horizon);
}

GRADWIRE_DECL call_end::~call_end() { s.end_call(rank); }

GRADWIRE_DECL void rank_state::charge_compute() {
  if (owner->model().compute == compute_model::measured) {
    const std::int64_t cpu = thread_cpu_ns();
    clock += stretched(duration(cpu - cpu_mark));
    cpu_mark = cpu;
  }
}

GRADWIRE_DECL std::int64_t rank_state::now_ns() {
  rank_state& s = owner->lane_of(rank);
  s.charge_compute();
  return s.clock.count();
}

GRADWIRE_DECL std::int64_t rank_state::run_in_background(void (*work)(void*), void* context) {
  if (rank_state& s = owner->lane_of(rank); &s != this) return s.run_in_background(work, context);
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

GRADWIRE_DECL void rank_state::advance_to(std::int64_t ns) {
  rank_state& s = owner->lane_of(rank);
  s.charge_compute();
  s.clock = std::max(s.clock, duration(ns));
}

GRADWIRE_DECL void rank_state::step_began() {
  owner->lane_of(rank).charge_compute();  // the compute so far ran at the previous step's pace
  rank_state& h = home();
  if (owner->model().stragglers.random()) h.step_factor = owner->model().stragglers.draw(h.rng);
}

GRADWIRE_DECL void rank_state::start_thread(void (*work)(void*), void* context) {
  owner->start_thread(rank, work, context);
}
GRADWIRE_DECL void rank_state::join_thread() noexcept { owner->join_thread(rank); }
GRADWIRE_DECL void rank_state::yield() {
  owner->begin_call(rank);
  owner->end_call(rank);
}
GRADWIRE_DECL bool rank_state::wait_signal(std::int64_t until_ns) {
  return owner->wait_signal(rank, until_ns == std::numeric_limits<std::int64_t>::max() ? never : time_point(duration(until_ns)));
}
GRADWIRE_DECL void rank_state::signal() { owner->signal(rank); }
GRADWIRE_DECL void rank_state::waits_end_on_signal(bool on) { owner->lane_of(rank).signal_ends_waits = on; }

}  // namespace gradwire::simulation::detail
