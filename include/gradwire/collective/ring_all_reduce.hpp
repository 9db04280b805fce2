// Ring all-reduce: reduce-scatter then all-gather around the ring, bandwidth-optimal for large messages.
#pragma once

#include <cstddef>
#include <span>

#include "../kernels/host.hpp"
#include "communicator.hpp"
#include "detail/exchange.hpp"
#include "verify.hpp"

namespace gradwire::collective {

namespace detail {
// Chunk i of n elements split over `parts`: the first n % parts chunks get one more.
struct chunking {
  std::size_t n, parts;
  std::size_t begin(std::size_t i) const noexcept { return i * (n / parts) + std::min(i, n % parts); }
  std::size_t length(std::size_t i) const noexcept { return n / parts + (i < n % parts ? 1 : 0); }
};
}  // namespace detail

// Reduces `data` element-wise across all ranks, in place; on return every rank holds
// the same, bit-identical result (each chunk is reduced by one rank, then copied).
// Each rank sends and receives 2(N-1)/N of the buffer: the ring's bandwidth optimum.
template <class Tr, class V>
void ring_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  const std::uint64_t sequence = comm.begin_operation();
  verify_same_call(comm, sequence,
                   {operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>});
  const int n = comm.size();
  if (n == 1 || data.empty()) {
    if (op == reduce_op::average && n > 1) kernels::scale(data.data(), V(1) / V(n), data.size());
    return;
  }
  const int me = comm.rank(), right = (me + 1) % n, left = (me + n - 1) % n;
  const detail::chunking chunks{data.size(), static_cast<std::size_t>(n)};
  auto chunk = [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); };
  // Staging for transports that cannot add on delivery; none is allocated for those that can.
  std::span<V> incoming;
  if constexpr (!concepts::accumulating_transport<Tr, V>) incoming = comm.template scratch<V>(chunks.length(0));

  // Reduce-scatter: after step s, the chunk received holds the sum over s+2 ranks.
  std::uint32_t step = 0;
  for (int s = 0; s < n - 1; ++s, ++step) {
    const int send_index = (me - s + n) % n, recv_index = (me - s - 1 + n) % n;
    detail::send_recv_accumulate(comm, make_tag(sequence, step), right, std::span<const V>(chunk(send_index)), left,
                                 chunk(recv_index), incoming);
  }
  // This rank now owns the fully reduced chunk me+1.
  if (op == reduce_op::average) {
    auto owned = chunk((me + 1) % n);
    kernels::scale(owned.data(), V(1) / V(n), owned.size());
  }
  // All-gather: pass the reduced chunks around, received straight into place.
  for (int s = 0; s < n - 1; ++s, ++step) {
    const int send_index = (me + 1 - s + n) % n, recv_index = (me - s + n) % n;
    detail::send_recv(comm, make_tag(sequence, step), right, std::span<const V>(chunk(send_index)), left,
                      chunk(recv_index));
  }
}

}  // namespace gradwire::collective
