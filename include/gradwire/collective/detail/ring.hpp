// The ring's two phases, shared by ring_all_reduce, reduce_scatter and all_gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../concepts.hpp"
#include "../../kernels/host.hpp"
#include "../chunking.hpp"
#include "../communicator.hpp"
#include "../verify.hpp"
#include "exchange.hpp"

namespace gradwire::collective::detail {

// Reduce-scatter around the ring (N > 1): N-1 steps, each sending one chunk right and
// adding the one from the left. On return rank r holds chunk r (see chunk_of) reduced
// over all ranks (averaged for reduce_op::average); other chunks hold partial sums.
// `step` is the next step of the operation's tag space; it is advanced.
template <class Tr, class V>
void ring_reduce_scatter(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, std::span<V> data,
                         reduce_op op) {
  const int n = comm.size(), me = comm.rank(), right = (me + 1) % n, left = (me + n - 1) % n;
  const chunking chunks{data.size(), static_cast<std::size_t>(n)};
  auto chunk = [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); };
  // Staging for transports that cannot add on delivery; none is allocated for those that can.
  std::span<V> incoming;
  if constexpr (!concepts::accumulating_transport<Tr, V>) incoming = comm.template scratch<V>(chunks.length(0));
  // After step s, the chunk received holds the sum over s+2 ranks; the last one is chunk me.
  for (int s = 0; s < n - 1; ++s, ++step) {
    const int send_index = (me - s - 1 + 2 * n) % n, recv_index = (me - s - 2 + 2 * n) % n;
    send_recv_accumulate(comm, make_tag(sequence, step), right, std::span<const V>(chunk(send_index)), left,
                         chunk(recv_index), incoming);
  }
  if (op == reduce_op::average) {
    auto owned = chunk(me);
    kernels::scale(owned.data(), V(1) / V(n), owned.size());
  }
}

// All-gather around the ring (N > 1): rank r's chunk r travels N-1 steps to the right,
// received straight into place, so every rank ends with every chunk.
template <class Tr, class V>
void ring_all_gather(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, std::span<V> data) {
  const int n = comm.size(), me = comm.rank(), right = (me + 1) % n, left = (me + n - 1) % n;
  const chunking chunks{data.size(), static_cast<std::size_t>(n)};
  auto chunk = [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); };
  for (int s = 0; s < n - 1; ++s, ++step) {
    const int send_index = (me - s + n) % n, recv_index = (me - s - 1 + n) % n;
    send_recv(comm, make_tag(sequence, step), right, std::span<const V>(chunk(send_index)), left, chunk(recv_index));
  }
}

}  // namespace gradwire::collective::detail
