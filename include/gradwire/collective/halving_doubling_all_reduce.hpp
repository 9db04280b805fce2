// Recursive halving-doubling all-reduce (Rabenseifner): 2 log2 N steps, for small and mid-size messages.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/exchange.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Reduces `data` element-wise across all ranks, in place, bit-identical on every rank.
//
// With P the largest power of two <= N: the first 2(N-P) ranks pair up and each even
// one folds its whole buffer into its odd partner and sits out, leaving P ranks. Those
// reduce-scatter by recursive halving (step k: exchange half of the current range with
// the rank whose k-th bit differs, keep and add the other half), so each ends owning
// one chunk (the ring's chunking over P), reduced over all N; then they all-gather by
// recursive doubling and the odd ranks send the result to their folded partners. Every
// element is reduced on exactly one rank and then only copied, hence bit-identical.
// Cost: 2 log2 P neighbour exchanges (+2 for N not a power of two) instead of the
// ring's 2(N-1), moving 2(P-1)/P of the buffer per rank like the ring does.
template <class Tr, class V>
void halving_doubling_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  require_known(op, "halving_doubling_all_reduce");
  const std::uint64_t sequence = comm.begin_operation();
  // The call check rides beside the first data (verify.hpp): partners beyond the ring
  // neighbours (every halving and doubling partner for N >= 4) get far frames.
  const int n = comm.size(), me = comm.rank();
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n))), extra = n - p;
  const bool folded = me < 2 * extra && me % 2 == 0, folds_in = me < 2 * extra && me % 2 == 1;
  // Rank among the P that take part, and back.
  const int virt = me < 2 * extra ? me / 2 : me - extra;
  auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  std::array<int, 32> partners{};
  std::size_t partner_count = 0;
  if (!folded)
    for (int mask = p / 2; mask >= 1; mask >>= 1) partners[partner_count++] = real(virt ^ mask);
  const std::span<const int> far(partners.data(), partner_count);
  std::optional<call_check<Tr>> check;
  post_call_check(check, comm, sequence,
                  {operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>,
                   algorithm_id::halving_doubling},
                  far);
  if (n == 1 || data.empty()) return settle_call_check(check);
  const auto rounds = static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(p)));
  // Tag steps: 0 fold, 1..rounds halving, rounds+1..2 rounds doubling, 2 rounds+1 unfold.
  const auto fold_tag = make_tag(sequence, 0), unfold_tag = make_tag(sequence, 2 * rounds + 1);
  const detail::chunking chunks{data.size(), static_cast<std::size_t>(p)};
  // Staging for transports that cannot add on delivery: the whole buffer for a rank that
  // takes a fold, else the largest half (the lower one; earlier chunks are longer).
  std::span<V> incoming;
  if constexpr (!concepts::accumulating_transport<Tr, V>)
    incoming = comm.template scratch<V>(folds_in ? data.size() : chunks.begin(static_cast<std::size_t>(p / 2)));

  if (folded) {  // hand the data over, get the result back
    auto handed = comm.transport().async_send(me + 1, fold_tag, std::as_bytes(std::span<const V>(data)));
    settle_call_check(check);
    comm.transport().wait(handed, comm.step_deadline());
    detail::recv(comm, me + 1, unfold_tag, data);
    return;
  }
  if (folds_in) {
    auto taken = detail::post_recv_accumulate(comm, fold_tag, me - 1, data, incoming);
    settle_call_check(check);
    detail::complete_accumulate(comm, taken, comm.step_deadline());
  }
  auto range = [&](std::size_t lo, std::size_t hi) { return data.subspan(chunks.begin(lo), chunks.begin(hi) - chunks.begin(lo)); };

  // Reduce-scatter: this rank's range of chunks [lo, hi) halves every step, ending at chunk virt.
  std::size_t lo = 0, hi = static_cast<std::size_t>(p);
  std::uint32_t step = 1;
  for (int mask = p / 2; mask >= 1; mask >>= 1, ++step) {
    const int partner = real(virt ^ mask);
    const std::size_t mid = lo + static_cast<std::size_t>(mask);
    const bool upper = (virt & mask) != 0;
    const auto keep = upper ? range(mid, hi) : range(lo, mid), give = upper ? range(lo, mid) : range(mid, hi);
    auto exchange = detail::post_exchange(comm, make_tag(sequence, step), partner, std::span<const V>(give), partner,
                                          keep, true, incoming);
    settle_call_check(check);  // beside the first step's messages; nothing later
    detail::complete_exchange(comm, exchange, comm.step_deadline());
    (upper ? lo : hi) = mid;
  }
  if (op == reduce_op::average) {
    auto owned = range(lo, hi);
    kernels::scale(owned.data(), V(1) / V(n), owned.size());
  }
  // All-gather: exchange the owned range with the partner's equally long neighbour, doubling it.
  for (int mask = 1; mask < p; mask <<= 1, ++step) {
    const int partner = real(virt ^ mask);
    const std::size_t theirs = lo ^ static_cast<std::size_t>(mask), width = hi - lo;
    detail::send_recv(comm, make_tag(sequence, step), partner, std::span<const V>(range(lo, hi)), partner,
                      range(theirs, theirs + width));
    lo = std::min(lo, theirs);
    hi = lo + 2 * width;
  }
  if (folds_in) detail::send(comm, me - 1, unfold_tag, std::span<const V>(data));
}

}  // namespace gradwire::collective
