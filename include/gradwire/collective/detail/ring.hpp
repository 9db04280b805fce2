// The ring's two phases, shared by ring_all_reduce, reduce_scatter, all_gather, reduce and hierarchical_all_reduce.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "../../concepts.hpp"
#include "../../kernels/host.hpp"
#include "../chunking.hpp"
#include "../communicator.hpp"
#include "../verify.hpp"
#include "exchange.hpp"

namespace gradwire::collective::detail {

// The ranks a ring runs over, in ring order, and this rank's position among them: every
// rank of the communicator (`ranks` empty: position i is rank i) or a subset (the ranks
// of one host, or one rank per host, for hierarchical_all_reduce).
struct ring_group {
  int size = 1, position = 0;
  std::span<const int> ranks;

  int rank_at(int i) const noexcept { return ranks.empty() ? i : ranks[static_cast<std::size_t>(i)]; }
  int right() const noexcept { return rank_at((position + 1) % size); }
  int left() const noexcept { return rank_at((position + size - 1) % size); }
};

// Which parts ring position `me` of `n` sends and receives at step s of each phase; shared
// by the blocking loops below and the pipelined hierarchical all-reduce's step lists.
struct ring_step {
  int send, recv;
};
inline ring_step reduce_scatter_step(int n, int me, int s) noexcept {
  // After step s, the part received holds the sum over s+2 ranks; the last one is part me.
  return {(me - s - 1 + 2 * n) % n, (me - s - 2 + 2 * n) % n};
}
inline ring_step all_gather_step(int n, int me, int s) noexcept { return {(me - s + n) % n, (me - s - 1 + n) % n}; }

template <class Tr>
ring_group everyone(const communicator<Tr>& comm) noexcept {
  return {comm.size(), comm.rank(), {}};
}

// Reduce-scatter around the ring of `group` (size > 1): size-1 steps, each sending one
// part right and adding the one from the left, where part(i) is the span<V> that ring
// position i ends up owning (any partition: the ring's even chunks, a host's columns).
// On return this rank's part(position) holds the reduction over the group (scaled by
// 1 / divisor for reduce_op::average); other parts hold partial sums. `step` is the next
// step of the operation's tag space; it is advanced by size-1. A posted call `check` is
// settled once the first step's messages are posted, before any is waited for.
template <class Tr, class Part>
void ring_reduce_scatter(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, const ring_group& group,
                         Part&& part, reduce_op op, int divisor, std::optional<call_check<Tr>>* check = nullptr) {
  using V = typename std::remove_cvref_t<decltype(part(0))>::value_type;
  const int n = group.size, me = group.position, right = group.right(), left = group.left();
  // Staging for transports that cannot add on delivery; none is allocated for those that can.
  std::span<V> incoming;
  if constexpr (!concepts::accumulating_transport<Tr, V>) {
    std::size_t longest = 0;
    for (int i = 0; i < n; ++i) longest = std::max(longest, part(i).size());
    incoming = comm.template scratch<V>(longest);
  }
  for (int s = 0; s < n - 1; ++s, ++step) {
    const ring_step at = reduce_scatter_step(n, me, s);
    if (s == 0 && check && *check) {
      auto first = post_exchange(comm, make_tag(sequence, step), right, std::span<const V>(part(at.send)), left,
                                 part(at.recv), true, incoming);
      settle_call_check(*check);
      complete_exchange(comm, first, comm.step_deadline());
      continue;
    }
    send_recv_accumulate(comm, make_tag(sequence, step), right, std::span<const V>(part(at.send)), left,
                         part(at.recv), incoming);
  }
  if (op == reduce_op::average) {
    auto owned = part(me);
    kernels::scale(owned.data(), V(1) / V(divisor), owned.size());
  }
}

// All-gather around the ring of `group` (size > 1): position i's part(i) travels size-1
// steps to the right, received straight into place, so every member ends with every part.
template <class Tr, class Part>
void ring_all_gather(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, const ring_group& group,
                     Part&& part) {
  using V = typename std::remove_cvref_t<decltype(part(0))>::value_type;
  const int n = group.size, me = group.position, right = group.right(), left = group.left();
  for (int s = 0; s < n - 1; ++s, ++step) {
    const ring_step at = all_gather_step(n, me, s);
    send_recv(comm, make_tag(sequence, step), right, std::span<const V>(part(at.send)), left, part(at.recv));
  }
}

// The whole communicator, `data` in the ring's chunks (chunk_of): rank r ends owning chunk
// r reduced over all ranks (averaged for reduce_op::average).
template <class Tr, class V>
void ring_reduce_scatter(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, std::span<V> data,
                         reduce_op op, std::optional<call_check<Tr>>* check = nullptr) {
  const chunking chunks{data.size(), static_cast<std::size_t>(comm.size())};
  ring_reduce_scatter(
      comm, sequence, step, everyone(comm), [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); }, op,
      comm.size(), check);
}

// The whole communicator: rank r's chunk r reaches every rank.
template <class Tr, class V>
void ring_all_gather(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, std::span<V> data) {
  const chunking chunks{data.size(), static_cast<std::size_t>(comm.size())};
  ring_all_gather(comm, sequence, step, everyone(comm),
                  [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); });
}

// The flat ring all-reduce's data phases (N > 1): reduce-scatter, then all-gather, from
// step 0 of `sequence`. Shared by ring_all_reduce and the hierarchical fallback. A
// posted call `check` is settled beside the first step's messages.
template <class Tr, class V>
void ring_all_reduce_phases(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op,
                            std::optional<call_check<Tr>>* check = nullptr) {
  std::uint32_t step = 0;
  ring_reduce_scatter(comm, sequence, step, data, op, check);
  if (check) settle_call_check(*check);  // a ring of one step count still settles it
  ring_all_gather(comm, sequence, step, data);
}

}  // namespace gradwire::collective::detail
