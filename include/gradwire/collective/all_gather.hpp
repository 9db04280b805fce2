// All-gather over the ring: every rank contributes its chunk of a buffer and ends with all of them.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "../error.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/ring.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// In place: rank r's chunk of `data` (chunk_of(data, N, r), as reduce_scatter leaves
// it) is its input; on return every rank holds every rank's chunk. Each rank sends and
// receives (N-1)/N of the buffer.
template <class Tr, class V>
void all_gather(communicator<Tr>& comm, std::span<V> data) {
  auto trace = comm.trace("all_gather", data.size_bytes());
  const std::uint64_t sequence = comm.begin_operation();
  std::optional<call_check<Tr>> check;  // settled beside the first data step (verify.hpp)
  post_call_check(check, comm, sequence, {operation::all_gather, 0, data.size(), dtype_of_v<V>});
  if (comm.size() == 1 || data.empty()) return settle_call_check(check);
  std::uint32_t step = 0;
  detail::ring_all_gather(comm, sequence, step, data, &check);
  settle_call_check(check);  // settled in the first step already; no path returns with it posted
}

// Copies `mine` into this rank's chunk of `out` (unless it is already there), then
// gathers in place. mine.size() must be the length of that chunk.
template <class Tr, class V>
void all_gather(communicator<Tr>& comm, std::span<const V> mine, std::span<V> out) {
  const auto slot = chunk_of(out, comm.size(), comm.rank());
  if (mine.size() != slot.size())
    throw error(errc::invalid_argument, "all_gather: rank " + std::to_string(comm.rank()) + " passed " +
                                            std::to_string(mine.size()) + " elements, but its chunk of " +
                                            std::to_string(out.size()) + " has " + std::to_string(slot.size()));
  if (!mine.empty() && mine.data() != slot.data()) std::memmove(slot.data(), mine.data(), mine.size_bytes());
  all_gather(comm, out);
}

}  // namespace gradwire::collective
