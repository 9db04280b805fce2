// compress::error_feedback<Codec>: a codec that carries what each encode lost into the next one (Seide et al. 2014, Karimireddy et al. 2019).
//
// Why/maths: with residual r (zero at first), encode(x) encodes c = x + r and keeps
// r' = c - decode(encode(c)), computed in V, exactly that and nothing else: the sum of what
// was sent over t steps differs from the sum of the inputs by the last residual alone
// (sum_t decode_t = sum_t x_t - r_t), so no part of a gradient is lost for good, only
// delayed. It turns a biased codec (top_k, int8's small elements) into one whose error stays
// bounded instead of accumulating, and is what makes top-k and int8 train like the
// uncompressed run (Karimireddy et al., "Error feedback fixes SignSGD"). Cost: one buffer of
// n elements of V per encoded buffer for r, and one more for c, both in the state, and a
// decode per encode. The residual is this rank's: a linear codec's re-encoding of partial
// sums on a ring (encode without a state) goes through Codec alone. PowerSGD keeps its own
// error feedback (compress::powersgd), so it is not wrapped.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "detail/payload.hpp"

namespace gradwire::compress {

// Codec: a concepts::compressor of kind linear or gathered (fp16, bf16, int8, top_k, or a
// user's).
template <class Codec>
class error_feedback {
  static_assert(Codec::kind != concepts::compression_kind::low_rank,
                "gradwire::compress::error_feedback<Codec>: a low-rank codec (powersgd) keeps its own error "
                "feedback across its two rounds; use it unwrapped");

 public:
  using codec_type = Codec;
  static constexpr concepts::compression_kind kind = Codec::kind;
  static constexpr const char* name = "error_feedback";

  explicit error_feedback(Codec codec = Codec()) : codec_(std::move(codec)) {}
  const Codec& codec() const noexcept { return codec_; }

  // residual: what the latest encode left out (zero before the first); corrected: scratch
  // for x + residual. Both allocated at init.
  template <class V>
  struct state {
    typename Codec::template state<V> codec;
    aligned_buffer<V> residual, corrected;
  };
  template <class V>
  state<V> init(std::size_t n) const {
    // The wrapper declares every member for any Codec, so the concept check of the wrapper
    // passes: the codec inside is checked here, where a misfit would otherwise fail deep below.
    static_assert(concepts::compressor<Codec, V>,
                  "gradwire::compress::error_feedback<Codec>: Codec does not satisfy gradwire::concepts::compressor "
                  "for this value type (kind, state<V>, init, encoded_bytes, encode, decode, decode_add; see "
                  "concepts.hpp)");
    return {codec_.template init<V>(n), aligned_buffer<V>(n), aligned_buffer<V>(n)};
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const {
    return codec_.template encoded_bytes<V>(n);
  }

  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    detail::check_state(name, s.residual.size(), in.size());
    if constexpr (detail::elementwise_bytes<Codec> > 0) {
      encode_by_blocks(s, in, out);
      return;
    }
    kernels::add(s.corrected.data(), in.data(), s.residual.data(), in.size());
    codec_.encode(s.codec, std::span<const V>(s.corrected.data(), in.size()), out);
    codec_.decode(std::span<const std::byte>(out), s.residual.span());  // what the receivers will read
    subtract(s.residual.data(), s.corrected.data(), in.size());
  }
  // The codec's map alone, for a partial sum that is nobody's own (linear codecs' rings).
  template <class V>
  void encode(std::span<const V> in, std::span<std::byte> out) const
    requires(Codec::kind == concepts::compression_kind::linear)
  {
    codec_.encode(in, out);
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    codec_.decode(in, out);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    codec_.decode_add(in, inout);
  }

 private:
  // The same four steps a block at a time, for a codec whose bytes of each element depend on
  // that element alone: the block stays in L1 from x + r to the new residual, so memory sees
  // x and r read and the payload and r written once (14 bytes an element for fp16 on float,
  // against 36 for whole-buffer passes).
  template <class V>
  void encode_by_blocks(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    constexpr std::size_t block = 2048, bytes = detail::elementwise_bytes<Codec>;
    detail::check_payload(Codec::name, out.size(), codec_.template encoded_bytes<V>(in.size()), in.size());
    for (std::size_t begin = 0; begin < in.size(); begin += block) {
      const std::size_t length = std::min(block, in.size() - begin);
      V* residual = s.residual.data() + begin;
      V* corrected = s.corrected.data() + begin;
      const std::span<std::byte> payload = out.subspan(begin * bytes, length * bytes);
      kernels::add(corrected, in.data() + begin, residual, length);
      codec_.encode(std::span<const V>(corrected, length), payload);
      codec_.decode(std::span<const std::byte>(payload), std::span<V>(residual, length));
      subtract(residual, corrected, length);
    }
  }

  // residual[i] = corrected[i] - residual[i]
  template <class V>
  static void subtract(V* GRADWIRE_RESTRICT residual, const V* GRADWIRE_RESTRICT corrected, std::size_t n) noexcept {
    GRADWIRE_VECTORIZE
    for (std::size_t i = 0; i < n; ++i) residual[i] = corrected[i] - residual[i];
  }

  Codec codec_;
};

}  // namespace gradwire::compress
