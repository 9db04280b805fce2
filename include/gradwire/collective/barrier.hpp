// Barrier by dissemination: ceil(log2 N) rounds of empty messages, no root.
#pragma once

#include <cstddef>
#include <span>

#include "communicator.hpp"
#include "detail/exchange.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Returns on each rank only after every rank has entered the barrier.
template <class Tr>
void barrier(communicator<Tr>& comm) {
  auto trace = comm.trace("barrier");
  const std::uint64_t sequence = comm.begin_operation();
  verify_same_call(comm, sequence, {operation::barrier, 0, 0, dtype::f32});
  const int n = comm.size(), me = comm.rank();
  std::uint32_t step = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++step)
    detail::send_recv(comm, make_tag(sequence, step), (me + distance) % n, std::span<const std::byte>{},
                      (me - distance + n) % n, std::span<std::byte>{});
}

}  // namespace gradwire::collective
