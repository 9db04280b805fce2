// How an in-process rank waits for a peer: spin, then yield, then sleep; the policy and its back-off after slow yields.
//
// The policy is chosen once per group by choose_wait_policy from the group's size and the
// CPUs this process may run on: first, only when the machine has a CPU to spare beyond one
// per rank, up to 1 us spinning with pause instructions; then, up to 50 us from the start,
// looking again after each sched_yield; then asleep on its condition variable until woken
// or its deadline (hub.hpp). Every phase ends at the deadline.
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
#pragma once

#include <algorithm>
#include <chrono>

#include "../../clock.hpp"

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

}  // namespace detail

}  // namespace gradwire::transport
