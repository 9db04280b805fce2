// all_reduce entry point: picks the algorithm (today the ring; more arrive with the network transports).
#pragma once

#include <span>

#include "communicator.hpp"
#include "ring_all_reduce.hpp"

namespace gradwire::collective {

// Algorithm tags (CUTLASS-style): auto_ lets the library choose by size and world.
struct auto_ {};
struct ring {};

template <class Algorithm = auto_, class Tr, class V>
void all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  static_assert(std::is_same_v<Algorithm, auto_> || std::is_same_v<Algorithm, ring>,
                "gradwire::collective::all_reduce: unknown algorithm tag (use auto_ or ring)");
  ring_all_reduce(comm, data, op);
}

}  // namespace gradwire::collective
