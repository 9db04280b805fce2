// The time a rank runs on: the clock every deadline is measured on, the deadline type, and
// the time source a transport hands down (the steady clock, or a simulated rank's virtual
// time). Below everything, so any header may name them.
//
// Where time comes from is one seam: code that waits, times a step, traces or runs a
// collective in the background asks the rank's transport for its time source
// (concepts::time_of(transport), communicator::time()). A transport that keeps no time of
// its own (tcp, ucx, mpi, inproc) runs on the steady clock; a simulated rank's endpoint
// hands out its virtual clock (transport/simulated/), so its deadlines, step stats,
// traces and background collectives are in virtual time.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradwire {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

// A clock in modelled time: what a simulated rank implements (transport/simulated/).
// Times are virtual nanoseconds since the simulation began.
class virtual_time {
 public:
  // Now (compute done so far is counted first).
  virtual std::int64_t now_ns() = 0;
  // Runs `work(context)` inline, as the rank's background thread would: on the background
  // clock (it starts at max(now, the end of the previous background work)); the caller's
  // clock is unchanged. Returns when, in virtual time, the work finished.
  virtual std::int64_t run_in_background(void (*work)(void*), void* context) = 0;
  // The caller waited for something that finished at `ns`: its clock moves there if behind.
  virtual void advance_to(std::int64_t ns) = 0;
  // A training step begins (a straggler model draws the step's slowdown).
  virtual void step_began() = 0;

  // A second thread of the rank's, in virtual time (K of N's communicator thread): work(context)
  // runs on a thread the scheduler takes turns with, from the caller's time on, while the
  // caller goes on. One at a time per rank; join_thread() waits until it returned.
  virtual void start_thread(void (*work)(void*), void* context) = 0;
  virtual void join_thread() noexcept = 0;
  // Between the rank's threads: lets every thread behind the caller in virtual time run
  // first (before the caller reads state another thread writes); waits until another thread
  // of the rank signals or until `until_ns` (false: the deadline came first); wakes them
  // (yield first, so that a thread behind is waiting by then: support/rank_condition.hpp does).
  virtual void yield() = 0;
  virtual bool wait_signal(std::int64_t until_ns) = 0;
  virtual void signal() = 0;
  // While on, the calling thread's transport waits also end, as timeouts, when another
  // thread of the rank signals (a wait that would poll for that thread in real time).
  virtual void waits_end_on_signal(bool on) = 0;

 protected:
  ~virtual_time() = default;
};

// A rank's time: the steady clock (default), or a virtual clock it refers to (which must
// outlive it). Cheap to copy (a pointer); concepts::clock_source.
class time_source {
 public:
  constexpr time_source() noexcept = default;
  explicit constexpr time_source(virtual_time& v) noexcept : virtual_(&v) {}

  // Now, as a deadline-comparable time point: steady time, or virtual nanoseconds since
  // the simulation began (the steady clock's epoch stands for the simulation's start).
  deadline now() const {
    if (virtual_) return deadline(std::chrono::duration_cast<clock::duration>(std::chrono::nanoseconds(virtual_->now_ns())));
    return clock::now();
  }
  // The deadline `timeout` from now on this clock: on a simulated rank, the real time
  // other ranks take never eats into it.
  template <class Rep, class Period>
  deadline deadline_after(std::chrono::duration<Rep, Period> timeout) const {
    return now() + std::chrono::duration_cast<clock::duration>(timeout);
  }
  // Whether background work runs inline, on a virtual background clock (a simulated rank
  // has no second thread to give), rather than on a thread of the caller's.
  bool runs_background_inline() const noexcept { return virtual_ != nullptr; }
  // Runs `work(context)` as the rank's background thread would (virtual time only; see
  // virtual_time::run_in_background); returns when it finished.
  deadline run_in_background(void (*work)(void*), void* context) const {
    return deadline(std::chrono::nanoseconds(virtual_->run_in_background(work, context)));
  }
  // The caller waited for something that finished at `when` (virtual time only: the steady
  // clock moves by itself).
  void advance_to(deadline when) const {
    if (virtual_)
      virtual_->advance_to(std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count());
  }
  // A training step begins: a simulated rank's straggler model draws the step's slowdown.
  void step_began() const {
    if (virtual_) virtual_->step_began();
  }
  // The rank's second thread in virtual time (virtual time only; virtual_time::start_thread).
  void start_thread(void (*work)(void*), void* context) const { virtual_->start_thread(work, context); }
  void join_thread() const noexcept {
    if (virtual_) virtual_->join_thread();
  }
  void waits_end_on_signal(bool on) const {
    if (virtual_) virtual_->waits_end_on_signal(on);
  }
  // The virtual clock, or null on the steady clock (for the timeline's and log's time base).
  virtual_time* virtual_clock() const noexcept { return virtual_; }

 private:
  virtual_time* virtual_ = nullptr;
};

}  // namespace gradwire
