// Predicted time of the rooted collectives central storage uses: reduce onto a root and broadcast from it.
#pragma once

#include <bit>
#include <cstddef>
#include <map>
#include <vector>

#include "../collective/broadcast.hpp"
#include "../collective/choice.hpp"
#include "../collective/detail/binomial_tree.hpp"
#include "../collective/reduce.hpp"
#include "all_reduce_cost.hpp"
#include "cluster_model.hpp"
#include "schedule.hpp"

namespace gradwire::plan {

namespace detail {
// The binomial tree's peers of `rank` (collective/detail/binomial_tree.hpp): its far frames.
inline std::vector<int> tree_peers(int n, int rank, int root) {
  const collective::detail::binomial_tree tree(n, rank, root);
  return {tree.peers().begin(), tree.peers().end()};
}
}  // namespace detail

// Tree reduce (reduce.hpp, below small_all_reduce_bytes or on two ranks): ceil(log2 N)
// rounds; in round k the ranks whose lowest set bit (relative to the root) is 2^k send
// their whole partial sum to the rank 2^k below, once they have their children's.
// Latency-optimal; the root receives log2 N whole buffers, one after another.
inline schedule tree_reduce_schedule(const cluster_model& c, std::size_t elements, int root = 0,
                                     const cost_options& o = {}) {
  const int n = c.size();
  schedule s;
  if (n < 2) return s;
  const double whole = double(elements) * double(o.element_bytes);
  if (elements > 0)
    for (int mask = 1; mask < n; mask <<= 1) {
      round_run r;
      for (int v = mask; v < n; v += 2 * mask) r.messages.push_back({(v + root) % n, (v - mask + root) % n, whole});
      s.runs.push_back(std::move(r));
    }
  s.check = call_check_frames(n, o, [&](int rank) { return detail::tree_peers(n, rank, root); });
  return s;
}

// Scatter-gather reduce (reduce.hpp, large buffers): the ring's reduce-scatter (N - 1
// rounds of one part, each rank to its right neighbour) and then every rank sends its
// reduced part to the root, whose ingress takes (N - 1) / N of the buffer in one round.
inline schedule scatter_gather_reduce_schedule(const cluster_model& c, std::size_t elements, int root = 0,
                                               const cost_options& o = {}) {
  const int n = c.size();
  schedule s;
  if (n < 2) return s;
  const double part = longest_chunk_bytes(elements, static_cast<std::size_t>(n), o.element_bytes);
  round_run step, gather;
  s.check = call_check_frames(n, o, no_far_peers);
  for (int r = 0; r < n; ++r) step.messages.push_back({r, (r + 1) % n, part});
  for (int r = 0; r < n; ++r)
    if (r != root) gather.messages.push_back({r, root, part});
  step.repeat = n - 1;
  s.runs.push_back(std::move(step));
  s.runs.push_back(std::move(gather));
  return s;
}

// Whether collective::reduce takes the tree here (else scatter-gather): the rule it calls,
// collective::reduce_takes_tree (on two ranks or below small_all_reduce_bytes).
inline bool reduce_takes_tree(const cluster_model& c, std::size_t elements, const cost_options& o = {}) noexcept {
  return collective::reduce_takes_tree(c.size(), elements * o.element_bytes, o.collective.small_all_reduce_bytes);
}

// What collective::reduce runs.
inline schedule reduce_schedule(const cluster_model& c, std::size_t elements, int root = 0, const cost_options& o = {}) {
  return reduce_takes_tree(c, elements, o) ? tree_reduce_schedule(c, elements, root, o)
                                           : scatter_gather_reduce_schedule(c, elements, root, o);
}

// collective::reduce's time onto `root`: its schedule's, message by message (pricing the
// scatter-gather's ring steps apart, as a closed ring recursion, was 0.5% over the
// simulator on 2 hosts of 4 ranks, where the schedule is within 0.02%).
inline double reduce_seconds(const cluster_model& c, std::size_t elements, int root = 0, const cost_options& o = {}) {
  return schedule_seconds(c, reduce_schedule(c, elements, root, o));
}

// Binomial broadcast (broadcast.hpp): each rank, as soon as it has the buffer, sends it to
// all its children at once, largest subtree first (one after another on its link): round
// d is the ranks d levels below the root forwarding. Data that fits the check frame
// reaches the root's right neighbour inside it.
inline schedule broadcast_schedule(const cluster_model& c, std::size_t elements, int root = 0, const cost_options& o = {}) {
  const int n = c.size();
  schedule s;
  if (n < 2) return s;
  const double whole = double(elements) * double(o.element_bytes);
  const bool in_frame = o.collective.verify && whole <= double(collective::check_inline_bytes);
  // Round d: every rank d levels below the root (d bits set, relative to it) forwards to
  // all its children at once, as broadcast's forward() posts them.
  std::map<int, round_run> by_depth;
  for (int v = 0; v < n; ++v) {
    const collective::detail::binomial_tree tree(n, (v + root) % n, root);
    for (int child : tree.children()) {
      if (in_frame && v == 0 && (child - root + n) % n == 1) continue;
      by_depth[std::popcount(static_cast<unsigned>(v))].messages.push_back({(v + root) % n, child, whole});
    }
  }
  for (auto& [depth, round] : by_depth) s.runs.push_back(std::move(round));
  s.check = call_check_frames(n, o, [&](int rank) { return detail::tree_peers(n, rank, root); });
  return s;
}

// collective::broadcast's time from `root`.
inline double broadcast_seconds(const cluster_model& c, std::size_t elements, int root = 0, const cost_options& o = {}) {
  return schedule_seconds(c, broadcast_schedule(c, elements, root, o));
}

}  // namespace gradwire::plan
