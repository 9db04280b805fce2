// Reduce-scatter over the ring: every rank ends with its own chunk reduced across all ranks.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/ring.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Reduces `data` (the full-length buffer, the same count on every rank) so that rank
// r's chunk (chunk_of(data, N, r), the ring's chunking) holds the reduction over all
// ranks, and returns that chunk. The rest of `data` is left holding partial sums.
// Each rank sends and receives (N-1)/N of the buffer.
template <class Tr, class V>
std::span<V> reduce_scatter(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  require_known(op, "reduce_scatter");
  auto trace = comm.trace("reduce_scatter", data.size_bytes());
  const std::uint64_t sequence = comm.begin_operation();
  std::optional<call_check<Tr>> check;  // settled beside the first data step (verify.hpp)
  post_call_check(check, comm, sequence,
                  {operation::reduce_scatter, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>});
  const auto mine = chunk_of(data, comm.size(), comm.rank());
  if (comm.size() == 1 || data.empty()) {
    settle_call_check(check);
    return mine;
  }
  std::uint32_t step = 0;
  detail::ring_reduce_scatter(comm, sequence, step, data, op, &check);
  settle_call_check(check);
  return mine;
}

}  // namespace gradwire::collective
