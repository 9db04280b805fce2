// Barrier by dissemination: ceil(log2 N) rounds of small messages, no root.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "communicator.hpp"
#include "detail/exchange.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Returns on each rank only after every rank has entered the barrier. In round k a rank
// sends to the rank 2^k to its right and waits for the one 2^k to its left. With the
// call check on, the check frame from the left neighbour is round 0's message, and the
// later rounds' messages carry the descriptor, compared on arrival: checking costs the
// barrier no round (and on 2 ranks no message; from 3, the frame to the left neighbour).
template <class Tr>
void barrier(communicator<Tr>& comm) {
  auto trace = comm.trace("barrier");
  const std::uint64_t sequence = comm.begin_operation();
  const call_descriptor mine{operation::barrier, 0, 0, dtype::f32};
  std::optional<call_check<Tr>> check;
  post_call_check(check, comm, sequence, mine);
  const int n = comm.size(), me = comm.rank();
  const bool verifying = check.has_value();
  int distance = 1;
  std::uint32_t step = 0;
  if (verifying) {
    settle_call_check(check);
    distance = 2, step = 1;
  }
  call_descriptor theirs{};
  for (; distance < n; distance <<= 1, ++step) {
    const int to = (me + distance) % n, from = (me - distance + n) % n;
    if (!verifying) {
      detail::send_recv(comm, make_tag(sequence, step), to, std::span<const std::byte>{}, from, std::span<std::byte>{});
      continue;
    }
    detail::send_recv(comm, make_tag(sequence, step), to, std::span<const call_descriptor>(&mine, 1), from,
                      std::span<call_descriptor>(&theirs, 1));
    detail::check_same_call(comm.transport(), sequence, me, from, mine, theirs);
  }
}

}  // namespace gradwire::collective
