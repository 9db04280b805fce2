// The ring's two phases, shared by ring_all_reduce, reduce_scatter, all_gather, reduce and hierarchical_all_reduce.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

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
    auto exchange = post_exchange(comm, make_tag(sequence, step), right, std::span<const V>(part(at.send)), left,
                                  part(at.recv), true, incoming);
    if (check) settle_call_check(*check);  // beside the first step's messages; nothing later
    complete_exchange(comm, exchange, comm.step_deadline());
  }
  if (op == reduce_op::average) {
    auto owned = part(me);
    kernels::scale(owned.data(), V(1) / V(divisor), owned.size());
  }
}

// All-gather around the ring of `group` (size > 1): position i's part(i) travels size-1
// steps to the right, received straight into place, so every member ends with every part.
// A posted call `check` is settled once the first step's messages are posted.
template <class Tr, class Part>
void ring_all_gather(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, const ring_group& group,
                     Part&& part, std::optional<call_check<Tr>>* check = nullptr) {
  using V = typename std::remove_cvref_t<decltype(part(0))>::value_type;
  const int n = group.size, me = group.position, right = group.right(), left = group.left();
  for (int s = 0; s < n - 1; ++s, ++step) {
    const ring_step at = all_gather_step(n, me, s);
    auto exchange = post_exchange(comm, make_tag(sequence, step), right, std::span<const V>(part(at.send)), left,
                                  part(at.recv), false, std::span<V>{});
    if (check) settle_call_check(*check);  // beside the first step's messages; nothing later
    complete_exchange(comm, exchange, comm.step_deadline());
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
void ring_all_gather(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, std::span<V> data,
                     std::optional<call_check<Tr>>* check = nullptr) {
  const chunking chunks{data.size(), static_cast<std::size_t>(comm.size())};
  ring_all_gather(
      comm, sequence, step, everyone(comm), [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); },
      check);
}

// The pipelined ring's segment size for transport Tr: Tr::ring_segment_bytes where the
// transport declares it (concepts::segmenting_transport), else 0 (not pipelined). A
// transport declares it where a segment costs no more than its bytes: inproc, where a
// segment received, added and sent on is still in cache. Over asio_tcp and UCX shared
// memory the extra messages (and wake-ups, with ranks sharing cores) cost more than the
// overlap gains: each link is a FIFO that whole-part messages already keep busy
// (measured: docs/perf/tcp.md).
template <class Tr>
constexpr std::size_t ring_segment_bytes_of() noexcept {
  if constexpr (concepts::segmenting_transport<Tr>)
    return Tr::ring_segment_bytes;
  else
    return 0;
}

// How many segments each ring part is cut into (1: not pipelined): one per
// `segment_bytes` of the longest part, at most max_ring_segments, and no more than the
// operation's tag space holds (a message step per segment and ring step).
inline constexpr int max_ring_segments = 64;
inline int ring_segments(std::size_t part_bytes, int ranks, std::size_t segment_bytes) noexcept {
  if (segment_bytes == 0) return 1;
  const std::size_t steps = 2 * static_cast<std::size_t>(ranks - 1);
  std::size_t wanted = std::min<std::size_t>(max_ring_segments, part_bytes / segment_bytes);
  while (wanted > 1 && steps * wanted >= verify_from_left) wanted /= 2;
  return static_cast<int>(std::max<std::size_t>(1, wanted));
}

// The ring all-reduce as one pipeline of segments (N > 1, segments > 1). Step t sends part
// (me - t - 1) and receives part (me - t - 2), mod N: the reduce-scatter's steps for t <
// N - 1 (received parts added in), then the all-gather's (copied). What step t receives
// is what step t + 1 sends, so each segment of it goes on to the right as soon as it is
// in, while the rest of the part is still arriving: the link never waits for a whole part
// to be received and added (the step-by-step ring below does). Every rank waits for its
// receives in the same (step, segment) order, and each wait depends only on sends posted
// after waits earlier in that order: no cycle.
template <class Tr, class V>
void pipelined_ring_all_reduce(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op,
                               int segments, std::optional<call_check<Tr>>* check) {
  auto& t = comm.transport();
  const int n = comm.size(), me = comm.rank(), right = (me + 1) % n, left = (me + n - 1) % n;
  const int steps = 2 * (n - 1), m = segments;
  const chunking parts{data.size(), static_cast<std::size_t>(n)};
  auto part_at = [&](int k) { return static_cast<std::size_t>(((me - k) % n + n) % n); };
  auto segment = [&](std::size_t part, int j) {
    const auto whole = data.subspan(parts.begin(part), parts.length(part));
    const chunking cut{whole.size(), static_cast<std::size_t>(m)};
    return whole.subspan(cut.begin(static_cast<std::size_t>(j)), cut.length(static_cast<std::size_t>(j)));
  };
  // Staging for transports that cannot add on delivery: one slot per segment (a
  // segment's next receive is posted only once its last one was added).
  const std::size_t slot = segment(0, 0).size();
  std::span<V> staging;
  if constexpr (!concepts::accumulating_transport<Tr, V>) staging = comm.template scratch<V>(slot * static_cast<std::size_t>(m));
  auto staging_of = [&](int j) { return staging.empty() ? staging : staging.subspan(slot * static_cast<std::size_t>(j)); };
  std::vector<std::optional<posted_accumulate<Tr, V>>> in(static_cast<std::size_t>(m));
  std::vector<std::optional<typename Tr::request>> out(static_cast<std::size_t>(steps * m));
  auto post = [&](int step, int j) {
    const auto tag = make_tag(sequence, static_cast<std::uint32_t>(step * m + j));
    const std::span<V> into = segment(part_at(step + 2), j);
    auto& received = in[static_cast<std::size_t>(j)];
    if (step >= n - 1)  // all-gather: copied into place
      received.emplace(posted_accumulate<Tr, V>{t.async_recv(left, tag, std::as_writable_bytes(into)), {}, {}});
    else
      received.emplace(post_recv_accumulate(comm, tag, left, into, staging_of(j)));
    out[static_cast<std::size_t>(step * m + j)].emplace(
        t.async_send(right, tag, std::as_bytes(std::span<const V>(segment(part_at(step + 1), j)))));
  };
  for (int j = 0; j < m; ++j) post(0, j);
  if (check) settle_call_check(*check);
  for (int step = 0; step < steps; ++step)
    for (int j = 0; j < m; ++j) {
      complete_accumulate(comm, *in[static_cast<std::size_t>(j)], comm.step_deadline());
      if (step == n - 2 && op == reduce_op::average) {  // this segment of this rank's part is fully reduced
        const auto owned = segment(part_at(step + 2), j);
        kernels::scale(owned.data(), V(1) / V(n), owned.size());
      }
      if (step + 1 == steps) continue;
      // An all-gather receive overwrites what the send N - 1 steps earlier read: that send
      // must be done first (it is, all but always, long since).
      if (const int earlier = step + 2 - n; earlier >= 0) {
        auto& sent = out[static_cast<std::size_t>(earlier * m + j)];
        t.wait(*sent, comm.step_deadline());
        sent.reset();
      }
      post(step + 1, j);
    }
  for (auto& sent : out)
    if (sent) t.wait(*sent, comm.step_deadline());
}

// The pipeline segments of the flat ring all-reduce of `data` (1: step by step); part of
// the call descriptor (call_descriptor::segments).
template <class Tr, class V>
int ring_segments_for(const communicator<Tr>& comm, std::span<const V> data) noexcept {
  const chunking parts{data.size(), static_cast<std::size_t>(comm.size())};
  return ring_segments(parts.length(0) * sizeof(V), comm.size(), ring_segment_bytes_of<Tr>());
}

// The flat ring all-reduce's data phases (N > 1): reduce-scatter, then all-gather, from
// step 0 of `sequence`; pipelined when `segments` (ring_segments_for) is more than one. A
// posted call `check` is settled beside the first step's messages.
template <class Tr, class V>
void ring_all_reduce_phases(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op,
                            int segments, std::optional<call_check<Tr>>& check) {
  if (segments > 1) return pipelined_ring_all_reduce(comm, sequence, data, op, segments, &check);
  std::uint32_t step = 0;
  ring_reduce_scatter(comm, sequence, step, data, op, &check);
  ring_all_gather(comm, sequence, step, data);
}

// The flat ring all-reduce with its call check: `mine` (naming the caller's algorithm)
// gets the ring's segment count, and the check rides beside the first step. Shared by
// ring_all_reduce and the hierarchical fallback.
template <class Tr, class V>
void checked_ring_all_reduce(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op,
                             call_descriptor mine) {
  const int segments = ring_segments_for(comm, std::span<const V>(data));
  mine.segments = static_cast<std::uint8_t>(segments);
  std::optional<call_check<Tr>> check;
  post_call_check(check, comm, sequence, mine);
  // One rank: the sum and the average are the data.
  if (comm.size() > 1 && !data.empty()) ring_all_reduce_phases(comm, sequence, data, op, segments, check);
  settle_call_check(check);  // settled in the first step already unless nothing was sent
}

}  // namespace gradwire::collective::detail
