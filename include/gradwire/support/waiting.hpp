// How every transport waits for a peer: the CPUs it may count on, and the one learned
// choice of whether polling hot before sleeping pays (spin_gate).
//
// All four transports wait the same way: poll for a short window, because a peer's answer
// often comes within microseconds and a sleep and wake-up cost more than that; then sleep
// (epoll for asio_tcp, the worker's event fd for ucx, a condition variable for inproc,
// short sleeps for mpi, which has no descriptor to sleep on). Whether the window is hot
// (no yield) is the choice this header makes once for all of them:
// - hot polling only helps while the rank waited for runs on another CPU, so it needs a
//   CPU per rank on this machine (cpu_per_rank; otherwise the window yields between polls,
//   which hands the CPU to the peer that an oversubscribed job needs to run);
// - and even then it only pays when the answer comes inside the window. When other
//   processes keep the CPUs busy it does not: a rank that spun its whole window and then
//   sleeps is woken late (the scheduler has charged it the spin), and a rank woken from
//   its sleep lands on its waker's CPU (wake-affine placement), where two ranks polling
//   hot each wait out the other's whole window. Measured on the loaded 2-core VM, 2 ranks,
//   4 B all-reduce: asio_tcp 130-155 us per round with a 50 us window against 21-31 us
//   sleeping at once; ucx shared memory 121 us hot against 6.4 us yielding
//   (docs/perf/tcp.md, docs/perf/ucx_sm.md). spin_gate learns this from the outcomes.
#pragma once

#include <algorithm>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>  // _mm_pause; not <immintrin.h>, ~60k lines of AVX-512
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace gradwire::support {

// The CPUs this process may run on: its affinity mask (taskset, cgroup cpusets, mpirun's
// binding) where the system tells, else std::thread::hardware_concurrency(); at least 1.
// A system call: ask once per transport, not per wait.
inline unsigned usable_cpus() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// Whether each of the `ranks_here` processes of a job on this machine can have a CPU of
// its own (the precondition of hot polling). Counts the machine's CPUs, not this
// process's affinity mask: the mask says nothing about where the peers run, and mpirun's
// binding gives each rank a mask of one CPU. (Ranks that are threads of one process,
// inproc, share one mask: they count usable_cpus().) Ask once per transport: glibc
// reads /sys on every call.
inline bool cpu_per_rank(int ranks_here) noexcept {
  return static_cast<unsigned>(std::max(ranks_here, 1)) <= std::max(1u, std::thread::hardware_concurrency());
}

// One turn of a hot poll: tells the CPU this is a spin (x86 pause), or yields elsewhere.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a wait polls before it sleeps, from a transport's poll_before_sleep: all of it
// with a CPU per rank; oversubscribed, a quarter, yielding between polls (long enough for
// a peer that shares the CPU to answer, short enough not to hold up the others).
template <class Duration>
Duration poll_window(Duration poll_before_sleep, bool cpu_per_rank) noexcept {
  return cpu_per_rank ? poll_before_sleep : poll_before_sleep / 4;
}

// Whether this wait polls hot, learned from how the last ones went. A hot window that
// paid (the answer came inside it) keeps the gate open. One that ran out closes it for
// the next waits: 1 after the first miss, doubling with each miss in a row up to
// max_skipped (64); then it opens for one wait to try again, and a window that pays
// resets the count. So on an idle machine a peer late for once (start-up, a page fault)
// costs one sleeping wait, where a fixed skip cost 64 (it made the first size of a
// 100-iteration benchmark 21 us instead of 11), and under steady load the window is
// tried once in 64 waits. One per waiting engine; not thread-safe (an engine's waits are
// serialised).
class spin_gate {
 public:
  static constexpr unsigned max_skipped = 64;

  // Whether this wait polls hot (a closed gate counts the wait it skipped).
  bool open() noexcept {
    if (skip_left_ == 0) return true;
    --skip_left_;
    return false;
  }
  // How the hot window of a wait that open() let poll went.
  void spun(bool paid) noexcept {
    if (paid) {
      misses_ = 0;
      return;
    }
    misses_ = std::min(misses_ + 1, max_misses);
    skip_left_ = 1u << (misses_ - 1);
  }
  unsigned misses_in_a_row() const noexcept { return misses_; }

 private:
  static constexpr unsigned max_misses = 7;  // 1 << 6 == max_skipped
  static_assert((1u << (max_misses - 1)) == max_skipped);
  unsigned misses_ = 0;
  unsigned skip_left_ = 0;
};

}  // namespace gradwire::support
