// all_reduce entry point: picks the algorithm by tag, or by size and topology for auto_.
#pragma once

#include <span>
#include <type_traits>

#include "choice.hpp"
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

// Algorithm: auto_ (choose_all_reduce in choice.hpp: one-shot for the smallest buffers,
// hierarchical from communicator_options::hierarchical_min_bytes on when ranks span hosts
// and some host has several, else halving-doubling below small_all_reduce_bytes and the
// ring from there on), ring, halving_doubling or hierarchical. Every rank must pass the
// same count.
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
  } else {
    const cluster::topology& layout = comm.topology();
    const algorithm_id chosen = choose_all_reduce({.ranks = comm.size(),
                                                   .hosts = layout.host_count(),
                                                   .most_ranks_on_a_host = layout.max_local_size(),
                                                   .bytes = data.size_bytes(),
                                                   .one_shot_possible = std::is_default_constructible_v<typename Tr::request>},
                                                  comm.options());
    trace.arg("algorithm", name_of(chosen));
    if (chosen == algorithm_id::one_shot)
      one_shot_all_reduce(comm, data, op);
    else if (chosen == algorithm_id::hierarchical)
      hierarchical_all_reduce(comm, data, op);
    else if (chosen == algorithm_id::halving_doubling)
      halving_doubling_all_reduce(comm, data, op);
    else
      ring_all_reduce(comm, data, op);
  }
}

}  // namespace gradwire::collective
