// All-reduce (sum) of a buffer through a codec (concepts::compressor), written once over the transport concept.
//
// How each kind of codec is reduced, and why every rank ends with the same bits:
//  linear    this rank's buffer goes through its state first (error feedback), and is
//            replaced by decode(encode(.)): the sum is then of what was sent. A ring
//            reduce-scatter (detail/ring.hpp's steps) sends each chunk re-encoded by the
//            codec alone and adds the decoded chunk it receives; the owner of each chunk
//            encodes the finished sum and takes decode(encode(sum)) itself, and the ring
//            all-gathers those encoded sums (ring_all_gather over byte slots), so every rank
//            decodes the same bytes. Each rank sends 2 (N-1)/N of the encoded buffer.
//  gathered  every rank's payload is all-gathered (ring_all_gather, a slot per rank) and
//            decode_add-ed in rank order, the same order everywhere. Each rank receives
//            N-1 payloads.
//  low_rank  the codec's two rounds, each an all_reduce of plain V (bit-identical on every
//            rank), with its maths between them.
// Everything is allocated in compressed_buffer's constructor, none per call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "all_reduce.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/exchange.hpp"
#include "detail/ring.hpp"

namespace gradwire::collective {

// One buffer's codec state and encoded bytes, for a job of `ranks`. Codec: a
// concepts::compressor<Codec, V>.
template <class Codec, class V>
class compressed_buffer {
  static_assert(concepts::compressor<Codec, V>,
                "gradwire::collective::compressed_buffer<Codec, V>: Codec must satisfy concepts::compressor<Codec, V> "
                "(kind, state<V>, init, encoded_bytes, encode, decode, decode_add; see concepts.hpp)");

 public:
  using codec_type = Codec;
  using state_type = typename Codec::template state<V>;

  compressed_buffer(const Codec& codec, std::size_t n, int ranks)
      : compressed_buffer(codec, n, ranks, codec.template init<V>(n)) {}
  // A buffer that packs tensors of these shapes, in order: a concepts::shape_aware_compressor
  // plans its state from them (PowerSGD: a matrix per tensor), any other codec from their sum.
  compressed_buffer(const Codec& codec, std::span<const shape> tensors, int ranks)
      : compressed_buffer(codec, elements_of(tensors), ranks, state_for(codec, tensors)) {}

  std::size_t size() const noexcept { return n_; }
  int ranks() const noexcept { return ranks_; }
  state_type& state() noexcept { return state_; }
  const state_type& state() const noexcept { return state_; }
  // Slot i: the encoded chunk i (linear) or rank i's payload (gathered).
  std::span<std::byte> slot(std::size_t i) noexcept {
    return slots_.span().subspan(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  std::span<std::byte> own() noexcept { return own_.span(); }

 private:
  compressed_buffer(const Codec& codec, std::size_t n, int ranks, state_type state)
      : n_(n), ranks_(ranks), state_(std::move(state)) {
    const auto count = static_cast<std::size_t>(ranks);
    offsets_.assign(count + 1, 0);
    if constexpr (Codec::kind == concepts::compression_kind::linear) {
      const detail::chunking chunks{n, count};
      for (std::size_t i = 0; i < count; ++i) offsets_[i + 1] = offsets_[i] + codec.template encoded_bytes<V>(chunks.length(i));
      own_ = aligned_buffer<std::byte>(codec.template encoded_bytes<V>(n));
    } else if constexpr (Codec::kind == concepts::compression_kind::gathered) {
      for (std::size_t i = 0; i < count; ++i) offsets_[i + 1] = offsets_[i] + codec.template encoded_bytes<V>(n);
    }
    slots_ = aligned_buffer<std::byte>(offsets_.back());
  }
  static std::size_t elements_of(std::span<const shape> tensors) noexcept {
    std::size_t n = 0;
    for (const shape& t : tensors) n += t.elements();
    return n;
  }
  static state_type state_for(const Codec& codec, std::span<const shape> tensors) {
    if constexpr (concepts::shape_aware_compressor<Codec, V>)
      return codec.template init<V>(tensors);
    else
      return codec.template init<V>(elements_of(tensors));
  }

  std::size_t n_;
  int ranks_;
  state_type state_;
  std::vector<std::size_t> offsets_;
  aligned_buffer<std::byte> slots_, own_;
};

namespace detail {
// The ring all-gather's steps (all_gather_step) over a compressed_buffer's byte slots: rank
// i's slot i reaches every rank. ring_all_gather's staging for reductions is typed on
// arithmetic elements, which encoded bytes are not.
template <class Tr, class Codec, class V>
void gather_slots(communicator<Tr>& comm, std::uint64_t sequence, std::uint32_t& step, compressed_buffer<Codec, V>& buffer) {
  const ring_group group = everyone(comm);
  for (int s = 0; s + 1 < group.size; ++s, ++step) {
    const ring_step at = all_gather_step(group.size, group.position, s);
    send_recv(comm, make_tag(sequence, step), group.right(),
              std::span<const std::byte>(buffer.slot(static_cast<std::size_t>(at.send))), group.left(),
              buffer.slot(static_cast<std::size_t>(at.recv)));
  }
}
}  // namespace detail

// Sums `data` over the ranks of `comm` through `codec`, in place; every rank ends with the
// same bits. `buffer` was made for data.size() and comm.size() and is kept across calls (it
// holds the codec's state). One rank: data goes through the codec (encode with its state,
// decode) like every rank's contribution would.
template <class Tr, class Codec, class V>
void compressed_all_reduce(communicator<Tr>& comm, const Codec& codec, compressed_buffer<Codec, V>& buffer,
                           std::span<V> data) {
  if (buffer.size() != data.size() || buffer.ranks() != comm.size())
    throw error(errc::invalid_argument, "gradwire::collective::compressed_all_reduce: a buffer of " +
                                            std::to_string(data.size()) + " elements over " +
                                            std::to_string(comm.size()) + " ranks with a compressed_buffer made for " +
                                            std::to_string(buffer.size()) + " over " + std::to_string(buffer.ranks()) +
                                            "; make one compressed_buffer per buffer and job size");
  auto trace = comm.trace("compressed_all_reduce", data.size_bytes());
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  if constexpr (Codec::kind == concepts::compression_kind::low_rank) {
    const std::span<V> first = codec.low_rank_begin(buffer.state(), std::span<const V>(data));
    all_reduce(comm, first);
    const std::span<V> second = codec.low_rank_middle(buffer.state());
    if (!second.empty()) all_reduce(comm, second);
    codec.low_rank_end(buffer.state(), data);
  } else if constexpr (Codec::kind == concepts::compression_kind::gathered) {
    codec.encode(buffer.state(), std::span<const V>(data), buffer.slot(me));
    if (n > 1 && !data.empty()) {
      std::uint32_t step = 0;
      detail::gather_slots(comm, comm.begin_operation(), step, buffer);
    }
    std::fill(data.begin(), data.end(), V(0));
    for (std::size_t r = 0; r < n; ++r) codec.decode_add(std::span<const std::byte>(buffer.slot(r)), data);
  } else {
    static_assert(Codec::kind == concepts::compression_kind::linear, "a codec's kind is linear, gathered or low_rank");
    // This rank's contribution is what its encode sends: its state sees the same bytes.
    codec.encode(buffer.state(), std::span<const V>(data), buffer.own());
    codec.decode(std::span<const std::byte>(buffer.own()), data);
    if (n == 1 || data.empty()) return;
    const detail::chunking chunks{data.size(), n};
    auto chunk = [&](std::size_t i) { return data.subspan(chunks.begin(i), chunks.length(i)); };
    const std::uint64_t sequence = comm.begin_operation();
    const detail::ring_group group = detail::everyone(comm);
    std::uint32_t step = 0;
    // Reduce-scatter: chunk at.send goes right re-encoded (the partial sum has no owner yet,
    // so the codec's map alone), chunk at.recv comes from the left and is added decoded.
    // The slots of the two chunks are the message buffers: each is the size of its chunk's
    // encoding, and the all-gather below overwrites them only after this loop.
    for (int s = 0; s + 1 < group.size; ++s, ++step) {
      const detail::ring_step at = detail::reduce_scatter_step(group.size, group.position, s);
      const auto send = static_cast<std::size_t>(at.send), recv = static_cast<std::size_t>(at.recv);
      codec.encode(std::span<const V>(chunk(send)), buffer.slot(send));
      detail::send_recv(comm, make_tag(sequence, step), group.right(), std::span<const std::byte>(buffer.slot(send)),
                        group.left(), buffer.slot(recv));
      codec.decode_add(std::span<const std::byte>(buffer.slot(recv)), chunk(recv));
    }
    // The owner's chunk holds the whole sum: encode it once and read back what the others will.
    codec.encode(std::span<const V>(chunk(me)), buffer.slot(me));
    codec.decode(std::span<const std::byte>(buffer.slot(me)), chunk(me));
    detail::gather_slots(comm, sequence, step, buffer);
    for (std::size_t i = 0; i < n; ++i)
      if (i != me) codec.decode(std::span<const std::byte>(buffer.slot(i)), chunk(i));
  }
}

}  // namespace gradwire::collective
