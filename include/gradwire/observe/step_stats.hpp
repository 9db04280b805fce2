// What a replica's steps cost: bytes moved, time in communication vs the optimizer vs the
// caller's own compute, and (parameter servers) how stale its gradients were.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "../support/traffic.hpp"

namespace gradwire::observe {

struct step_stats {
  std::uint64_t steps = 0;  // steps these figures add up (1 for the latest step)
  // Payload this rank sent and received during step(); measured only over a transport
  // that counts it (concepts::metered_transport; every gradwire transport does).
  support::traffic_counters traffic;
  bool traffic_measured = false;
  std::chrono::nanoseconds in_step{0};    // inside step()
  std::chrono::nanoseconds optimizer{0};  // of that, applying the optimizer (on this rank)
  // Between steps: from the end of the previous step() (or of construction) to the start
  // of this one, i.e. the caller's forward and backward pass and data loading.
  std::chrono::nanoseconds compute{0};
  // Parameter-server workers: the servers' version when the gradient arrived minus the
  // version it was computed on (0 in sync modes); over several steps, the largest.
  std::optional<std::uint64_t> staleness;
  // K-of-N all-reduce (backup workers): steps that closed without this rank's gradients
  // (it was late; they were dropped). Over several steps, the sum.
  std::uint64_t dropped = 0;

  // Time inside step() that was not the optimizer: communication, waiting for slower
  // replicas, reduction and (device tensors) staging.
  std::chrono::nanoseconds communication() const noexcept { return in_step - optimizer; }
  // The share of a step's wall time (compute + in_step) spent communicating, in [0, 1].
  double communication_share() const noexcept {
    const auto whole = (compute + in_step).count();
    return whole > 0 ? static_cast<double>(communication().count()) / static_cast<double>(whole) : 0.0;
  }

  step_stats& operator+=(const step_stats& more) noexcept {
    steps += more.steps;
    traffic += more.traffic;
    traffic_measured = traffic_measured || more.traffic_measured;
    in_step += more.in_step;
    optimizer += more.optimizer;
    compute += more.compute;
    if (more.staleness) staleness = std::max(staleness.value_or(0), *more.staleness);
    dropped += more.dropped;
    return *this;
  }
};

// One line: "12 steps: sent 4.19 MB, received 4.19 MB, communication 31.2 ms (41%),
// optimizer 2.1 ms, compute 42.0 ms, staleness <= 3" (per step when steps > 1: "/step").
inline std::string to_string(const step_stats& s) {
  const double n = s.steps > 1 ? static_cast<double>(s.steps) : 1.0;
  const char* per = s.steps > 1 ? "/step" : "";
  auto ms = [&](std::chrono::nanoseconds t) { return static_cast<double>(t.count()) / 1e6 / n; };
  char line[320];
  int at = std::snprintf(line, sizeof line, "%llu step%s: ", static_cast<unsigned long long>(s.steps),
                         s.steps == 1 ? "" : "s");
  if (s.traffic_measured)
    at += std::snprintf(line + at, sizeof line - static_cast<std::size_t>(at), "sent %.3g MB%s, received %.3g MB%s, ",
                        static_cast<double>(s.traffic.bytes_sent) / 1e6 / n, per,
                        static_cast<double>(s.traffic.bytes_received) / 1e6 / n, per);
  at += std::snprintf(line + at, sizeof line - static_cast<std::size_t>(at),
                      "communication %.3g ms%s (%.0f%%), optimizer %.3g ms%s, compute %.3g ms%s", ms(s.communication()),
                      per, 100.0 * s.communication_share(), ms(s.optimizer), per, ms(s.compute), per);
  if (s.staleness)
    at += std::snprintf(line + at, sizeof line - static_cast<std::size_t>(at), ", staleness %s%llu",
                        s.steps > 1 ? "<= " : "", static_cast<unsigned long long>(*s.staleness));
  if (s.dropped > 0)
    std::snprintf(line + at, sizeof line - static_cast<std::size_t>(at), ", dropped %llu",
                  static_cast<unsigned long long>(s.dropped));
  return line;
}

}  // namespace gradwire::observe
