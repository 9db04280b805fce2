// One-shot all-reduce for small buffers: one round of messages, the call check riding along.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "choice.hpp"
#include "communicator.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Latency is all a small all-reduce has: halving-doubling needs 2 log2 N rounds. Here
// every rank sends its data to every other rank and adds what arrives: one round. On 2
// ranks that moves the same bytes as halving-doubling (the whole buffer each way) in half
// the rounds; on N ranks each sends N - 1 copies, so auto_ takes it while that stays
// within communicator_options::one_shot_max_sent_bytes. With the call check on, data of
// at most check_inline_bytes for the two ring neighbours rides inside the check frames
// (verify.hpp), so checking costs no message of its own: on 2 ranks one message each
// way, checked or not; larger data goes as plain messages posted beside the frames (no
// round of their own). The check is waited for first, so ranks that disagree (another
// count, dtype, algorithm or collective) get the check's mismatch naming both calls.
// Every rank adds the N buffers in rank order, so all get the same bits. At most
// one_shot_max_ranks ranks; when auto_ takes it: choose_all_reduce (choice.hpp).

namespace detail {
inline constexpr std::uint32_t one_shot_step = 0;
}  // namespace detail

template <class Tr, class V>
void one_shot_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  require_known(op, "one_shot_all_reduce");
  static_assert(std::is_default_constructible_v<typename Tr::request>,
                "one_shot_all_reduce keeps its requests in an array: Tr::request must be default-constructible");
  const std::uint64_t sequence = comm.begin_operation();
  const int n = comm.size(), me = comm.rank();
  if (n > one_shot_max_ranks)
    throw error(errc::invalid_argument, "one_shot_all_reduce: at most " + std::to_string(one_shot_max_ranks) +
                                            " ranks, got " + std::to_string(n));
  if (n == 1) return;
  // (The n copies must be addressable; this bound also tells GCC, which otherwise warns
  // about a copy of 2^64 - 4 bytes on a path it cannot rule out.)
  if (data.size() > std::numeric_limits<std::size_t>::max() / sizeof(V) / one_shot_max_ranks)
    throw error(errc::invalid_argument, "one_shot_all_reduce: " + std::to_string(data.size()) + " elements are too many");
  // Slot r holds rank r's data (this rank's own: a copy, as `data` receives the sum).
  const std::span<V> slots = comm.template scratch<V>(data.size() * static_cast<std::size_t>(n));
  auto slot = [&](int r) { return slots.subspan(data.size() * static_cast<std::size_t>(r), data.size()); };
  // (Guarded: with no elements both pointers may be null, which memcpy must not get.)
  if (!data.empty()) std::memcpy(slot(me).data(), data.data(), data.size_bytes());

  std::optional<call_check<Tr>> check;
  const bool inline_data = data.size_bytes() <= check_inline_bytes;
  // Every peer gets this rank's data: ranks beyond the two ring neighbours (N >= 4) are
  // checked too (far frames), ahead of their data.
  std::array<int, one_shot_max_ranks> everyone{};
  for (int r = 0; r < n; ++r) everyone[static_cast<std::size_t>(r)] = r;
  const std::span<const int> peers(everyone.data(), static_cast<std::size_t>(n));
  post_call_check(check, comm, sequence,
                  {operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>,
                   algorithm_id::one_shot},
                  peers, inline_data ? std::as_bytes(std::span<const V>(slot(me))) : std::span<const std::byte>{});
  // Peers whose data comes in the check frames get no data message.
  auto in_frame = [&](int r) { return check && inline_data && (r == check->left() || r == check->right()); };

  auto& t = comm.transport();

  // Two ranks, data not in the frames, a transport that adds on delivery: the peer's
  // buffer is added straight into `data` as it arrives (a + b == b + a exactly in IEEE
  // arithmetic, so both ranks still get the same bits); only the copy this rank sends from
  // is made: two passes over the buffer instead of four.
  constexpr bool adds_on_delivery = concepts::accumulating_transport<Tr, V>;
  const bool fused = adds_on_delivery && n == 2 && !in_frame(1 - me);
  const auto tag = make_tag(sequence, detail::one_shot_step);
  std::array<typename Tr::request, one_shot_max_ranks> receives, sends;
  for (int r = 0; r < n; ++r) {
    if (r == me || in_frame(r)) continue;
    if constexpr (adds_on_delivery)
      if (fused) {
        receives[r] = t.async_recv_accumulate(r, tag, data);
        continue;
      }
    receives[r] = t.async_recv(r, tag, std::as_writable_bytes(slot(r)));
  }
  for (int r = 0; r < n; ++r)
    if (r != me && !in_frame(r)) sends[r] = t.async_send(r, tag, std::as_bytes(std::span<const V>(slot(me))));
  if (check) {
    check->finish();
    if (inline_data)
      for (int r : {check->left(), check->right()})
        if (r != me) {
          const auto bytes = check->inline_from(r, data.size_bytes());
          if (!bytes.empty()) std::memcpy(slot(r).data(), bytes.data(), bytes.size());
        }
  }
  const auto until = comm.step_deadline();
  for (int r = 0; r < n; ++r)
    if (r != me && !in_frame(r)) t.wait(receives[r], until), t.wait(sends[r], until);

  if (!fused) {
    std::copy_n(slot(0).data(), data.size(), data.data());
    for (int r = 1; r < n; ++r) kernels::add(data.data(), slot(r).data(), data.size());
  }
  if (op == reduce_op::average) kernels::scale(data.data(), V(1) / V(n), data.size());
}

}  // namespace gradwire::collective
