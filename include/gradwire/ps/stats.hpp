// What a parameter server saw (server_stats, which serve() returns) and helpers to read its histograms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gradwire::ps {

struct server_stats {
  std::uint64_t resumed_from = 0;   // the version its checkpoint held at start (0: fresh)
  std::uint64_t version = 0;        // closed steps (sync modes) or the slowest live worker's clock (async modes)
  std::uint64_t updates = 0;        // optimizer updates applied
  std::uint64_t applied = 0;        // gradients applied (sync: part of a closed step)
  std::uint64_t dropped = 0;        // gradients dropped (backup workers: late for a closed step)
  std::uint64_t one_sided = 0;      // gradients a worker put into this server's window (the rest came as messages)
  std::vector<std::uint64_t> pushes;            // per worker: gradients received
  std::vector<std::uint64_t> dropped_by;        // per worker: of those, dropped
  std::vector<std::uint64_t> staleness;         // histogram: staleness[k] = applied gradients of staleness k
  std::vector<std::uint64_t> update_lag;        // histogram of updates applied between pull and push
  std::vector<int> lost_workers;                // ranks dropped after their loss (async modes), each time
  std::vector<int> rejoined_workers;            // ranks whose replacement process was taken back, each time
  std::uint64_t max_lead = 0;                   // largest clock lead of a worker whose pull was answered
  // Failover (ps::options::standby). A standby that took its lost server's shard over:
  // promoted, at that version (before it, the counters above are the server's, as
  // replicated). A server whose standby was lost goes on unreplicated: standby_lost.
  bool promoted = false;
  std::uint64_t promoted_at = 0;
  bool standby_lost = false;
  // A standby: the gradients its server had applied at its last update (part of applied);
  // after taking over, the gradients workers resent for a step it already had (not dropped).
  // applied - replicated + dropped + resent == the sum of pushes, for every server.
  std::uint64_t replicated = 0;
  std::uint64_t resent = 0;
};

// Quantile of a histogram (counts per value); 0 for an empty one.
inline std::uint64_t histogram_quantile(std::span<const std::uint64_t> counts, double q) {
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  if (total == 0) return 0;
  const auto rank = static_cast<std::uint64_t>(q * static_cast<double>(total - 1));
  std::uint64_t seen = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    seen += counts[k];
    if (seen > rank) return k;
  }
  return counts.size() - 1;
}
inline double histogram_mean(std::span<const std::uint64_t> counts) {
  double sum = 0, total = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) sum += static_cast<double>(k) * counts[k], total += counts[k];
  return total > 0 ? sum / total : 0.0;
}

namespace detail {
// Counts one more `value` (values past 2^16 share the last bucket, so a wild clock cannot
// grow the histogram without bound).
inline void record(std::vector<std::uint64_t>& histogram, std::uint64_t value) {
  const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(value, 1u << 16));
  if (histogram.size() <= k) histogram.resize(k + 1, 0);
  ++histogram[k];
}
}  // namespace detail

}  // namespace gradwire::ps
