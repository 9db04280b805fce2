// The calling thread's virtual clock when it is a simulated rank: what timing code reads instead of the steady clock.
//
// A simulated rank (transport/simulated/) runs the user's real code on a thread of its own while
// time is modelled. The few places that read or shape time (the timeline, step stats, the
// async engine's background thread, a step's start) ask this hook first, so that a
// simulated job's traces and stats are in virtual time and a background collective runs
// on a virtual clock of its own. Below observe/ and collective/ so that neither includes
// transport/simulated/; a thread that is not a simulated rank pays one thread-local read.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradwire::support {

class virtual_clock {
 public:
  // Virtual nanoseconds since the simulation began (compute done so far is counted first).
  virtual std::int64_t now_ns() = 0;
  // Runs `work(context)` inline, as the rank's background thread would: on the background
  // clock (it starts at max(now, the end of the previous background work)); the caller's
  // clock is unchanged. Returns when, in virtual time, the work finished.
  virtual std::int64_t run_in_background(void (*work)(void*), void* context) = 0;
  // The caller waited for something that finished at `ns`: its clock moves there if behind.
  virtual void advance_to(std::int64_t ns) = 0;
  // A training step begins (a straggler model draws the step's slowdown).
  virtual void step_began() = 0;

 protected:
  ~virtual_clock() = default;
};

// The calling thread's virtual clock; null unless the thread is a simulated rank.
inline virtual_clock*& this_thread_virtual_clock() noexcept {
  thread_local virtual_clock* clock = nullptr;
  return clock;
}

// The steady clock, or the virtual one on a simulated rank: what step stats are timed with.
struct step_clock {
  using base = std::chrono::steady_clock;
  using duration = base::duration;
  using time_point = base::time_point;
  static time_point now() noexcept {
    if (virtual_clock* v = this_thread_virtual_clock())
      return time_point(std::chrono::duration_cast<duration>(std::chrono::nanoseconds(v->now_ns())));
    return base::now();
  }
};

// Tells a simulated rank's clock that a training step begins; nothing elsewhere.
inline void step_began() {
  if (virtual_clock* v = this_thread_virtual_clock()) v->step_began();
}

}  // namespace gradwire::support
