// K of N for a bucketed all-reduce: the steps as the communicator's thread runs them, a late rank's run-ahead (docs/elastic.md).
//
// With b backups a step closes when N - b ranks have their first bucket ready
// (close_watch.hpp says how every rank learns the same set). One job on the communicator's
// thread runs the steps in order, each the same collectives on every rank: the step's
// round, then its buckets' all-reduces. A rank in the set reduces its buckets as its
// caller completes them; a late rank reduces zeros in its place, into a buffer of its own,
// and goes on to the next step's round without waiting for its caller (still computing a
// gradient that will be dropped): that keeps a slow replica from setting the pace. The
// caller's finish then applies every step completed since its last one, in order, and
// says how many, so that the loop skips the steps it missed.
//
// The job runs ahead only through the steps the caller planned (plan_steps, the same on
// every rank), so that between plans the communicator is idle for the caller's own
// collectives; and at most max_behind steps ahead of its caller (a buffer each).
//
// On a simulated rank the job runs on the rank's second virtual thread (clock.hpp's
// start_thread) and the two wait for each other in virtual time (support/rank_condition.hpp),
// so that a late replica's communicator goes on in the simulator as it does on a network.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../../collective/async_engine.hpp"
#include "../../collective/communicator.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../support/rank_condition.hpp"
#include "../../tensor/aligned_buffer.hpp"
#include "close_watch.hpp"

namespace gradwire::aggregation::detail {

template <class V, class Tr>
class k_of_n {
 public:
  using communicator_type = collective::communicator<Tr>;
  // Reduces bucket k over a flat buffer (the caller's gradients, or a late step's zeros).
  using reduce_fn = void (*)(void* agent, communicator_type& comm, std::size_t k, std::span<V> flat);

  // A step the caller missed, completed without it: the others' sums and their scale.
  struct late_sum {
    std::uint64_t step;
    V scale;
    std::span<const V> sums;
    step_set set;
  };

  k_of_n(int backups, int max_behind) : backups_(backups), max_behind_(max_behind) {
    if (backups < 0)
      throw error(errc::invalid_argument, "all_reduce: backup_workers = " + std::to_string(backups) + " must be >= 0");
    if (backups > 0 && max_behind < 1)
      throw error(errc::invalid_argument, "all_reduce: max_steps_behind = " + std::to_string(max_behind) +
                                              " must be >= 1 (a late replica keeps at least the step it missed)");
  }
  // Movable between plans (a running job refers to the shared state, which stays put).
  k_of_n(k_of_n&&) noexcept = default;
  k_of_n& operator=(k_of_n&&) noexcept = default;
  ~k_of_n() {
    if (!shared_) return;
    {
      std::lock_guard lock(shared_->mutex);
      shared_->budget = 0;  // a job still running stops after its step (at worst at the step timeout)
    }
    job_ = {};
    shared_->time.join_thread();
  }

  int backups() const noexcept { return backups_; }
  bool enabled() const noexcept { return backups_ > 0; }

  // Checks the job; allocates the late steps' buffers (touched now, not in a step).
  // `flat`: the caller's flat buffer, which a step it is in reduces its buckets in.
  void setup(const communicator_type& comm, std::span<V> flat, std::size_t buckets, reduce_fn reduce) {
    if (!enabled()) return;
    const std::string asked = "all_reduce: backup_workers = " + std::to_string(backups_);
    if (backups_ >= comm.size())
      throw error(errc::config, asked + " needs more ranks than backups, and the job has " +
                                    std::to_string(comm.size()) + ": at least one rank's gradients must be in each step");
    if constexpr (!concepts::multiplexing_transport<Tr>)
      throw error(errc::config, asked + ": K of N needs a transport that waits for any of several messages "
                                        "(concepts::multiplexing_transport; asio_tcp, ucx, inproc and mpi have it)");
    shared_ = std::make_unique<shared>(comm.size(), backups_, comm.time());
    shared_->flat = flat;
    shared_->buckets = buckets;
    shared_->reduce = reduce;
    shared_->slots.resize(static_cast<std::size_t>(max_behind_));
    for (auto& s : shared_->slots) {
      s.buffer.reserve_discard(flat.size());
      std::fill_n(s.buffer.data(), flat.size(), V(0));
    }
  }

  // The caller, between steps: the next n steps (n >= 1) run back to back on every rank, so a
  // late rank's communicator thread may go through them without its caller. Every rank must
  // plan the same steps; the caller's own collectives wait until they are done.
  void plan_steps(std::uint64_t n) {
    if (n == 0) throw error(errc::invalid_argument, "all_reduce: plan_steps(0): plan at least the next step");
    if (!shared_) return;  // no backups: every step waits for every rank anyway
    const auto lock = shared_->changed.lock(shared_->mutex);
    shared_->budget = std::max(shared_->budget, shared_->applied + n - 1);
  }

  // The caller's step (the next it has not applied), and whether it is in it.
  std::uint64_t step() const noexcept { return step_; }
  bool in() const noexcept { return in_; }

  // The caller opens its step: the communicator's thread runs it, and the planned steps
  // after it (started here unless a job runs or ran it; `agent` is what reduce_fn is given).
  void begin_step(communicator_type& comm, void* agent) {
    shared& sh = *shared_;
    {
      const auto lock = sh.changed.lock(sh.mutex);
      if (sh.failure) std::rethrow_exception(sh.failure);
      step_ = sh.applied;
      in_ = false;
      sh.launched = 0;
      sh.budget = std::max(sh.budget, step_);
      // The job runs this step already, or ran it: it went on through the plan while this
      // rank was late, and the caller takes those steps' sums. A new job here would open a
      // step's round that every other rank has closed (a hang until the step timeout).
      if (sh.running || sh.done > step_) return;
      sh.running = true;
      sh.start = step_;
      sh.agent = agent;
      sh.comm = &comm;
    }
    job_ = {};  // the last plan's job has ended
    if (sh.time.runs_background_inline()) {
      sh.time.join_thread();
      try {
        sh.time.start_thread([](void* state) { static_cast<shared*>(state)->run(*static_cast<shared*>(state)->comm); },
                             &sh);
      } catch (...) {
        std::lock_guard lock(sh.mutex);
        sh.running = false;  // no job runs: the next step may start one
        throw;
      }
    } else {
      job_ = comm.async().submit([state = &sh](communicator_type& c) { state->run(c); });
    }
  }

  // The caller: its first bucket of the step is complete. Whether it is in the step (its
  // buckets are reduced) or late (its gradients are dropped).
  bool first_bucket_ready() {
    in_ = shared_->watch.mark_ready(step_);
    return in_;
  }
  // The caller: bucket k of its step is complete (buckets go in order).
  void bucket_launched(std::size_t k) {
    if (!in_) return;
    const auto lock = shared_->changed.lock(shared_->mutex);
    shared_->launched = k + 1;
    shared_->changed.notify_all();
  }

  // finish(), in the step: waits for its set; returns the scale, 1 / (ranks in).
  V wait_set(const communicator_type& comm) {
    shared& sh = *shared_;
    auto lock = sh.changed.lock(sh.mutex);
    sh.wait_for(lock, comm, step_, [&] { return sh.set_known > step_; }, "the step's round");
    last_set_ = sh.record(step_).set;
    return scale_of(last_set_);
  }
  // finish(), in the step: waits for bucket k's sums (in the caller's flat buffer).
  void wait_bucket(const communicator_type& comm, std::size_t k) {
    shared& sh = *shared_;
    auto lock = sh.changed.lock(sh.mutex);
    sh.wait_for(lock, comm, step_, [&] { return sh.reduced > k; }, "bucket " + std::to_string(k) + "'s all-reduce");
  }
  // finish(), late: waits for the step, then gives every step completed since, in order.
  std::vector<late_sum> wait_late(const communicator_type& comm) {
    shared& sh = *shared_;
    auto lock = sh.changed.lock(sh.mutex);
    sh.wait_for(lock, comm, step_, [&] { return sh.done > step_; }, "the step the others closed");
    std::vector<late_sum> out;
    for (const auto& r : sh.records)
      if (r.step >= step_ && r.step < sh.done)
        out.push_back({r.step, scale_of(r.set),
                       std::span<const V>(sh.slots[static_cast<std::size_t>(r.slot)].buffer.data(), sh.flat.size()), r.set});
    last_set_ = out.back().set;
    return out;
  }
  // finish(): the caller has applied step `through` and every one before it. At the end of
  // a plan, waits for the job, so that the communicator is the caller's again.
  void applied(const communicator_type& comm, std::uint64_t through) {
    shared& sh = *shared_;
    bool plan_done;
    {
      auto lock = sh.changed.lock(sh.mutex);
      sh.applied = through + 1;
      sh.release_through(through);
      plan_done = sh.applied > sh.budget;
      if (plan_done && sh.time.runs_background_inline()) {
        sh.wait_for(lock, comm, step_, [&] { return !sh.running; }, "the plan's last step");
        lock.unlock();
        sh.time.join_thread();
      }
    }
    advanced_ = through + 1 - step_;
    if (plan_done && job_.valid()) job_.wait(comm.queued_collective_deadline());
  }

  // The latest finish: who was in its last step (the same on every rank), whether this
  // rank's gradients were dropped, and how many steps it applied (more than 1: steps
  // completed without this rank while it computed).
  const step_set& last_set() const noexcept { return last_set_; }
  bool last_dropped() const noexcept { return enabled() && !in_; }
  std::uint64_t last_advanced() const noexcept { return advanced_; }

 private:
  static V scale_of(const step_set& set) { return V(1) / static_cast<V>(set.size()); }

  struct slot {
    aligned_buffer<V> buffer;
    bool used = false;
  };
  struct step_record {
    std::uint64_t step;
    step_set set;
    int slot;  // a late step's sums; -1: the caller's flat buffer
  };

  // What the caller and the communicator's thread share, under `mutex`; it stays put when
  // the k_of_n moves.
  struct shared {
    shared(int size, int backups, time_source t) : time(t), watch(size, backups, t), changed(t) {}

    time_source time;  // the rank's: on a simulated rank, the job runs on its second virtual thread
    close_watch<Tr> watch;
    communicator_type* comm = nullptr;  // the running job's
    std::span<V> flat;
    std::size_t buckets = 0;
    void* agent = nullptr;
    reduce_fn reduce = nullptr;
    std::vector<slot> slots;

    std::mutex mutex;
    support::rank_condition changed;
    std::deque<step_record> records;  // steps run and not yet applied
    std::uint64_t applied = 0;        // steps the caller has applied
    std::uint64_t budget = 0;         // the last planned step
    std::uint64_t start = 0;          // where the running job began
    std::uint64_t set_known = 0;      // steps whose set is known
    std::uint64_t done = 0;           // steps run to the end
    std::size_t launched = 0;         // the caller's buckets of its step, complete
    std::size_t reduced = 0;          // buckets of the current in step, reduced
    bool running = false;
    std::exception_ptr failure;

    step_record& record(std::uint64_t step) {  // mutex held
      for (auto& r : records)
        if (r.step == step) return r;
      throw error(errc::invalid_argument, "all_reduce (K of N): no record of step " + std::to_string(step));
    }
    void release_through(std::uint64_t through) {  // mutex held
      while (!records.empty() && records.front().step <= through) {
        if (records.front().slot >= 0) slots[static_cast<std::size_t>(records.front().slot)].used = false;
        records.pop_front();
      }
      changed.notify_all();
    }

    // The caller waits (until the queued-collective deadline: the job's own waits time out first).
    template <class Ready>
    void wait_for(std::unique_lock<std::mutex>& lock, const communicator_type& comm, std::uint64_t step, Ready ready,
                  const std::string& what) {
      if (!changed.wait_until(lock, comm.queued_collective_deadline(), [&] { return ready() || failure; }))
        throw error(errc::timeout, "all_reduce (K of N): rank " + std::to_string(comm.rank()) + ", step " +
                                       std::to_string(step) + ": " + what + " did not end before the deadline");
      if (!ready()) std::rethrow_exception(failure);
    }
    // The job waits (until the step timeout).
    template <class Ready>
    void job_wait(std::unique_lock<std::mutex>& lock, const communicator_type& comm, Ready ready, const std::string& what) {
      if (!changed.wait_until(lock, comm.step_deadline(), ready))
        throw error(errc::timeout, "all_reduce (K of N): rank " + std::to_string(comm.rank()) + " waited for " + what +
                                       " past the step timeout");
    }

    // The communicator's thread: the planned steps, from `start` on, one after another.
    void run(communicator_type& comm) {
      try {
        if constexpr (concepts::multiplexing_transport<Tr>) {
          auto lock = changed.lock(mutex);
          for (std::uint64_t s = start;; ++s) {
            lock.unlock();
            watch.open(s);
            const step_set set = watch.run(comm);
            lock = changed.lock(mutex);
            if (set.self_in) {
              records.push_back({s, set, -1});
              set_known = s + 1;
              reduced = 0;
              changed.notify_all();
              for (std::size_t k = 0; k < buckets; ++k) {
                job_wait(lock, comm, [&] { return launched > k; }, "its caller's bucket " + std::to_string(k));
                lock.unlock();
                reduce(agent, comm, k, flat);
                lock = changed.lock(mutex);
                reduced = k + 1;
                changed.notify_all();
              }
            } else {
              auto is_free = [](const slot& x) { return !x.used; };
              job_wait(lock, comm, [&] { return std::any_of(slots.begin(), slots.end(), is_free); },
                       "a free buffer (its caller is " + std::to_string(slots.size()) + " steps behind)");
              auto& free = *std::find_if(slots.begin(), slots.end(), is_free);
              free.used = true;
              records.push_back({s, set, static_cast<int>(&free - slots.data())});
              set_known = s + 1;
              changed.notify_all();
              lock.unlock();
              const std::span<V> sums(free.buffer.data(), flat.size());
              std::fill(sums.begin(), sums.end(), V(0));  // this rank's part: nothing
              for (std::size_t k = 0; k < buckets; ++k) reduce(agent, comm, k, sums);
              lock = changed.lock(mutex);
            }
            done = s + 1;
            changed.notify_all();
            if (s + 1 > budget) {
              running = false;
              return;
            }
          }
        }
      } catch (...) {
        std::lock_guard lock(mutex);
        failure = std::current_exception();
        running = false;
        changed.notify_all();
        throw;
      }
    }
  };

  int backups_, max_behind_;
  std::unique_ptr<shared> shared_;  // made at setup, with backups
  // The caller's own.
  std::uint64_t step_ = 0, advanced_ = 0;
  bool in_ = false;
  step_set last_set_;
  collective::async_handle job_;  // last: its job ends before the rest goes
};

}  // namespace gradwire::aggregation::detail
