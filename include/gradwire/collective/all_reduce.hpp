// all_reduce entry point: picks the algorithm by tag, or by size for auto_.
#pragma once

#include <span>
#include <type_traits>

#include "communicator.hpp"
#include "halving_doubling_all_reduce.hpp"
#include "one_shot_all_reduce.hpp"
#include "ring_all_reduce.hpp"

namespace gradwire::collective {

// Algorithm tags (CUTLASS-style): auto_ lets the library choose by size; ring and
// halving_doubling force one.
struct auto_ {};
struct ring {};
struct halving_doubling {};

template <class Algorithm>
inline constexpr bool is_all_reduce_algorithm_v = std::is_same_v<Algorithm, auto_> || std::is_same_v<Algorithm, ring> ||
                                                  std::is_same_v<Algorithm, halving_doubling>;

// Algorithm: auto_ (one round of frames up to one_shot_max_bytes over at most
// one_shot_max_ranks ranks, halving-doubling below communicator_options::small_all_reduce_bytes,
// the ring from there on), ring or halving_doubling. Every rank must pass the same count.
template <class Algorithm = auto_, class Tr, class V>
void all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  static_assert(is_all_reduce_algorithm_v<Algorithm>,
                "gradwire::collective::all_reduce: unknown algorithm tag (use auto_, ring or halving_doubling)");
  auto trace = comm.trace("all_reduce", data.size_bytes());
  if constexpr (std::is_same_v<Algorithm, ring>) {
    trace.arg("algorithm", "ring");
    ring_all_reduce(comm, data, op);
  } else if constexpr (std::is_same_v<Algorithm, halving_doubling>) {
    trace.arg("algorithm", "halving_doubling");
    halving_doubling_all_reduce(comm, data, op);
  } else if (takes_one_shot(comm, std::span<const V>(data))) {
    trace.arg("algorithm", "one_shot");
    one_shot_all_reduce(comm, data, op);
  } else if (data.size_bytes() < comm.options().small_all_reduce_bytes) {
    trace.arg("algorithm", "halving_doubling");
    halving_doubling_all_reduce(comm, data, op);
  } else {
    trace.arg("algorithm", "ring");
    ring_all_reduce(comm, data, op);
  }
}

}  // namespace gradwire::collective
