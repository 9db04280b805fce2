// all_reduce entry point: picks the algorithm by tag, or by size and topology for auto_.
#pragma once

#include <span>
#include <type_traits>

#include "communicator.hpp"
#include "halving_doubling_all_reduce.hpp"
#include "hierarchical_all_reduce.hpp"
#include "one_shot_all_reduce.hpp"
#include "ring_all_reduce.hpp"

namespace gradwire::collective {

// Algorithm tags (CUTLASS-style): auto_ lets the library choose by size and topology;
// ring, halving_doubling and hierarchical force one.
struct auto_ {};
struct ring {};
struct halving_doubling {};
struct hierarchical {};

template <class Algorithm>
inline constexpr bool is_all_reduce_algorithm_v = std::is_same_v<Algorithm, auto_> || std::is_same_v<Algorithm, ring> ||
                                                  std::is_same_v<Algorithm, halving_doubling> ||
                                                  std::is_same_v<Algorithm, hierarchical>;

// Whether all_reduce<auto_> takes the hierarchical path for `bytes`: ranks span hosts, some
// host has several, and the buffer is at least communicator_options::hierarchical_min_bytes.
template <class Tr>
bool takes_hierarchical(const communicator<Tr>& comm, std::size_t bytes) noexcept {
  return bytes >= comm.options().hierarchical_min_bytes && has_hierarchy(comm);
}

// Algorithm: auto_ (one round, one-shot, while the copies a rank sends stay within
// communicator_options::one_shot_max_sent_bytes over at most one_shot_max_ranks ranks; hierarchical from communicator_options::hierarchical_min_bytes
// on when ranks span hosts and some host has several; else halving-doubling below
// communicator_options::small_all_reduce_bytes and the ring from there on), ring,
// halving_doubling or hierarchical. Every rank must pass the same count.
template <class Algorithm = auto_, class Tr, class V>
void all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  static_assert(is_all_reduce_algorithm_v<Algorithm>,
                "gradwire::collective::all_reduce: unknown algorithm tag (use auto_, ring, halving_doubling or "
                "hierarchical)");
  auto trace = comm.trace("all_reduce", data.size_bytes());
  if constexpr (std::is_same_v<Algorithm, ring>) {
    trace.arg("algorithm", "ring");
    ring_all_reduce(comm, data, op);
  } else if constexpr (std::is_same_v<Algorithm, halving_doubling>) {
    trace.arg("algorithm", "halving_doubling");
    halving_doubling_all_reduce(comm, data, op);
  } else if constexpr (std::is_same_v<Algorithm, hierarchical>) {
    trace.arg("algorithm", has_hierarchy(comm) ? "hierarchical" : "hierarchical (flat ring: one host or one rank per host)");
    hierarchical_all_reduce(comm, data, op);
  } else if (takes_one_shot(comm, std::span<const V>(data))) {
    trace.arg("algorithm", "one_shot");
    one_shot_all_reduce(comm, data, op);
  } else if (takes_hierarchical(comm, data.size_bytes())) {
    trace.arg("algorithm", "hierarchical");
    hierarchical_all_reduce(comm, data, op);
  } else if (data.size_bytes() < comm.options().small_all_reduce_bytes) {
    trace.arg("algorithm", "halving_doubling");
    halving_doubling_all_reduce(comm, data, op);
  } else {
    trace.arg("algorithm", "ring");
    ring_all_reduce(comm, data, op);
  }
}

}  // namespace gradwire::collective
