// Ring all-reduce: reduce-scatter then all-gather around the ring, bandwidth-optimal for large messages.
#pragma once

#include <cstddef>
#include <span>

#include "../kernels/host.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/ring.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Reduces `data` element-wise across all ranks, in place; on return every rank holds
// the same, bit-identical result (each chunk is reduced by one rank, then copied).
// Each rank sends and receives 2(N-1)/N of the buffer: the ring's bandwidth optimum.
template <class Tr, class V>
void ring_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  require_known(op, "ring_all_reduce");
  const std::uint64_t sequence = comm.begin_operation();
  detail::checked_ring_all_reduce(comm, sequence, data, op,
                                  {operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>,
                                   algorithm_id::ring});
}

}  // namespace gradwire::collective
