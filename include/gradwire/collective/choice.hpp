// The rules that pick a collective's algorithm from sizes and layout, written once for the collectives and the cost models.
//
// all_reduce<auto_>, hierarchical_all_reduce and reduce choose from numbers every rank has
// alike (ranks, hosts, the buffer's bytes, communicator_options), so the ranks agree
// without a message; the cost models (plan/all_reduce_cost.hpp, rooted_cost.hpp)
// call the same functions with a cluster_model's numbers, so they price what runs.
#pragma once

#include <cstddef>

#include "../support/topology.hpp"
#include "communicator.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// one_shot_all_reduce's limit: it keeps its peers in an array of this many ranks, and
// all_reduce<auto_> never takes it over more (each rank sends N - 1 whole copies).
inline constexpr int one_shot_max_ranks = 8;

// What all_reduce<auto_> chooses from.
struct all_reduce_inputs {
  int ranks = 1;
  int hosts = 1;                 // how many hosts the ranks span
  int most_ranks_on_a_host = 1;  // the fullest host's ranks
  std::size_t bytes = 0;         // the buffer: count x sizeof(element), the same on every rank
  // Whether the transport can run one-shot at all: its requests must wait in an array
  // (Tr::request default-constructible).
  bool one_shot_possible = true;
};

// all_reduce<auto_>'s algorithm, in this order:
//   1. one-shot (one round) on 2..one_shot_max_ranks ranks while the N - 1 copies a rank
//      sends stay within one_shot_max_sent_bytes on one host; across hosts only what fits
//      in the call check's frame (check_inline_bytes), as there the copies cross the slow
//      links and hierarchical or halving-doubling send fewer;
//   2. hierarchical from hierarchical_min_bytes on, where the ranks span hosts and some
//      host has several (cluster::topology::spans_hosts_with_shared_host);
//   3. halving-doubling (2 log2 N latency-bound rounds) below small_all_reduce_bytes;
//   4. the ring (bandwidth-optimal) from there on.
// Every rank must pass the same options; ranks that choose differently get the call
// check's mismatch naming both algorithms.
constexpr algorithm_id choose_all_reduce(const all_reduce_inputs& in, const communicator_options& o) noexcept {
  if (in.one_shot_possible && in.ranks >= 2 && in.ranks <= one_shot_max_ranks &&
      (in.hosts > 1 ? in.bytes <= check_inline_bytes
                    : in.bytes * static_cast<std::size_t>(in.ranks - 1) <= o.one_shot_max_sent_bytes))
    return algorithm_id::one_shot;
  if (in.bytes >= o.hierarchical_min_bytes &&
      cluster::topology::spans_hosts_with_shared_host(in.hosts, in.most_ranks_on_a_host))
    return algorithm_id::hierarchical;
  return in.bytes < o.small_all_reduce_bytes ? algorithm_id::halving_doubling : algorithm_id::ring;
}

// Whether hierarchical_all_reduce runs the flat ring instead of its three phases: with
// no hierarchy to use (one host, or one rank per host) or nothing to reduce.
constexpr bool hierarchical_runs_flat_ring(bool has_hierarchy, std::size_t elements) noexcept {
  return elements == 0 || !has_hierarchy;
}

// Whether reduce takes the binomial tree (ceil(log2 N) rounds, latency-optimal) rather
// than ring reduce-scatter + gather (N rounds, 2(N-1)/N of the buffer into the root):
// below small_all_reduce_bytes, and on 1 or 2 ranks, where the tree moves no more.
constexpr bool reduce_takes_tree(int ranks, std::size_t bytes, std::size_t small_all_reduce_bytes) noexcept {
  return ranks <= 2 || bytes < small_all_reduce_bytes;
}

}  // namespace gradwire::collective
