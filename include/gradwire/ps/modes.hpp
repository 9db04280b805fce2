// A parameter server's consistency modes: when a server applies gradients and when it answers a pull.
//
//   ps::sync               one gradient from every live worker, then one update (their mean);
//   ps::backup_workers<b>  a step closes after the first N-b gradients; gradients that
//                          arrive for a closed step are dropped and counted (Chen et al. 2016);
//   ps::async              each gradient is applied on arrival; a pull is answered at once;
//   ps::bounded_staleness<s>  async, but a worker more than s steps ahead of the slowest
//                          live worker waits for its pull (stale synchronous parallel).
// Each is a tag that satisfies concepts::ps_mode; a user's own mode names the same four members.
#pragma once

#include "../concepts.hpp"

namespace gradwire::ps {

// on_arrival: apply each gradient as it comes (else a step sums them and applies the mean);
// backups: how many late workers a step can do without; max_lead: how far a worker may run
// ahead of the slowest live one (-1: unbounded).
struct sync {
  static constexpr const char* name = "sync";
  static constexpr bool on_arrival = false;
  static constexpr int backups = 0;
  static constexpr int max_lead = -1;
};
struct async {
  static constexpr const char* name = "async";
  static constexpr bool on_arrival = true;
  static constexpr int backups = 0;
  static constexpr int max_lead = -1;
};
template <int S>
struct bounded_staleness {
  static_assert(S >= 0, "ps::bounded_staleness<s>: s must be >= 0 (0: every worker waits for the slowest)");
  static constexpr const char* name = "bounded_staleness";
  static constexpr bool on_arrival = true;
  static constexpr int backups = 0;
  static constexpr int max_lead = S;
};
template <int B>
struct backup_workers {
  static_assert(B >= 1, "ps::backup_workers<b>: b must be >= 1 (b = 0 is ps::sync)");
  static constexpr const char* name = "backup_workers";
  static constexpr bool on_arrival = false;
  static constexpr int backups = B;
  static constexpr int max_lead = -1;
};

static_assert(concepts::ps_mode<sync> && concepts::ps_mode<async> && concepts::ps_mode<bounded_staleness<1>> &&
              concepts::ps_mode<backup_workers<1>>);

}  // namespace gradwire::ps
