// compress::int8: symmetric 8-bit integers with one float scale per encoded buffer, about 1 byte an element.
//
// Why/maths: scale = max|x| / 127 over the buffer (a bucket, or a ring chunk), stored as a
// float ahead of the bytes; q_i = round(x_i / scale) to nearest, ties to even, in [-127, 127];
// decode gives q_i scale. Each element comes back within scale / 2 (plus the rounding of
// q_i scale into V), the same absolute error for every element of the buffer: small
// gradients beside one large one lose most of their bits, which is why the scale is per
// bucket and not per model, and why error_feedback<int8> is the usual way to run it. The
// payload is 4 + n bytes (a quarter of float's). Linear (concepts::compression_kind): a ring
// decodes each hop's chunk, adds, and re-encodes with the partial sum's own scale. A buffer
// holding NaN or an infinity has no finite scale: encode refuses it (errc::invalid_argument),
// as it does a payload whose scale is not a finite, non-negative float.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host.hpp"
#include "detail/narrow_float.hpp"
#include "detail/payload.hpp"

namespace gradwire::compress {

class int8 {
 public:
  static constexpr concepts::compression_kind kind = concepts::compression_kind::linear;
  static constexpr const char* name = "int8";

  // Nothing to keep between steps: the state only remembers the length it was made for.
  template <class V>
  using state = detail::length_state<V>;
  template <class V>
  state<V> init(std::size_t n) const {
    return {n};
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const noexcept {
    return sizeof(float) + n;
  }

  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    detail::check_state(name, s.n, in.size());
    encode(in, out);
  }
  template <class V>
  void encode(std::span<const V> in, std::span<std::byte> out) const {
    detail::check_payload(name, out.size(), encoded_bytes<V>(in.size()), in.size());
    const V largest = largest_magnitude(in.data(), in.size());
    const auto scale = static_cast<float>(static_cast<double>(largest) / 127);
    if (!std::isfinite(scale))  // largest is infinite for a NaN too
      throw error(errc::invalid_argument,
                  "gradwire::compress::int8: the buffer holds NaN, an infinity, or a magnitude beyond float's "
                  "range times 127, so its scale max|x|/127 is not a finite float; find where the gradients "
                  "diverge (strategy<>'s finite check names the tensor), or use bf16, which carries them");
    detail::store<float>(out.data(), scale);
    quantise(in.data(), out.data() + sizeof(float), in.size(), scale > 0 ? static_cast<double>(scale) : 1.0);
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    const float scale = checked_scale<V>(in, out.size());
    dequantise<false>(in.data() + sizeof(float), out.data(), out.size(), static_cast<double>(scale));
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    const float scale = checked_scale<V>(in, inout.size());
    dequantise<true>(in.data() + sizeof(float), inout.data(), inout.size(), static_cast<double>(scale));
  }

 private:
  // max|x| by the bits: with the sign cleared, the integer order of floats is their order by
  // magnitude, and NaN's bits are above infinity's, so a NaN comes back as infinity. Sixteen
  // running maxima, a fixed count that GCC vectorises at -O2 without a reduction clause.
  template <class V>
  static V largest_magnitude(const V* GRADWIRE_RESTRICT in, std::size_t n) noexcept {
    using U = typename detail::wide_float<V>::bits;
    constexpr U magnitude = ~U{0} >> 1, infinity = std::bit_cast<U>(std::numeric_limits<V>::infinity());
    constexpr std::size_t lanes = 16;
    U top[lanes] = {};
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes)
      for (std::size_t l = 0; l < lanes; ++l) top[l] = std::max(top[l], std::bit_cast<U>(in[i + l]) & magnitude);
    for (; i < n; ++i) top[0] = std::max(top[0], std::bit_cast<U>(in[i]) & magnitude);
    const U largest = *std::max_element(top, top + lanes);
    return std::bit_cast<V>(std::min(largest, infinity));
  }

  // q_i = round(x_i / divisor), ties to even, clamped to +-127 (the last ulp). A division in
  // double, not a product with 1/scale, whose rounding could move a tie; rounded to an
  // integer by adding and taking off 1.5 2^52, which is nearbyint's ties to even in the
  // default rounding mode, and vectorises where a call to nearbyint does not.
  template <class V>
  static std::byte quantised(V x, double divisor) noexcept {
    constexpr double round = 0x1.8p52;
    double q = (static_cast<double>(x) / divisor + round) - round;
    q = q < -127.0 ? -127.0 : q;
    q = q > 127.0 ? 127.0 : q;
    return static_cast<std::byte>(static_cast<std::int8_t>(static_cast<std::int32_t>(q)));
  }
  // In steps of a fixed 32 elements (a 32-byte vector of bytes) and a remainder, as
  // cast_codec's loops: vectorised at -O2 with or without the gradwire target's -fopenmp-simd.
  static constexpr std::size_t step = 32;
  template <class V>
  static void quantise(const V* GRADWIRE_RESTRICT in, std::byte* GRADWIRE_RESTRICT out, std::size_t n,
                       double divisor) noexcept {
    std::size_t i = 0;
    for (; i + step <= n; i += step)
      GRADWIRE_VECTORIZE
      for (std::size_t j = i; j < i + step; ++j) out[j] = quantised(in[j], divisor);
    for (; i < n; ++i) out[i] = quantised(in[i], divisor);
  }
  // q_i scale, exact in double (8 bits times a float's 24), then rounded once into V. In
  // float the product would round the same, but decode_add's sum could then be contracted
  // into a fused multiply-add (GCC's default -ffp-contract=fast), which rounds differently.
  template <class V>
  static V dequantised(std::byte q, double scale) noexcept {
    return static_cast<V>(static_cast<double>(static_cast<std::int8_t>(q)) * scale);
  }
  template <bool Add, class V>
  static void dequantise(const std::byte* GRADWIRE_RESTRICT in, V* GRADWIRE_RESTRICT out, std::size_t n,
                         double scale) noexcept {
    std::size_t i = 0;
    for (; i + step <= n; i += step)
      GRADWIRE_VECTORIZE
      for (std::size_t j = i; j < i + step; ++j) out[j] = Add ? out[j] + dequantised<V>(in[j], scale) : dequantised<V>(in[j], scale);
    for (; i < n; ++i) out[i] = Add ? out[i] + dequantised<V>(in[i], scale) : dequantised<V>(in[i], scale);
  }

  template <class V>
  float checked_scale(std::span<const std::byte> in, std::size_t n) const {
    detail::check_payload(name, in.size(), encoded_bytes<V>(n), n);
    const auto scale = detail::load<float>(in.data());
    if (!(scale >= 0) || !std::isfinite(scale))
      throw error(errc::invalid_argument, "gradwire::compress::int8: a payload whose scale is " +
                                              std::to_string(scale) +
                                              " (NaN, infinite or negative): it was not written by int8's encode "
                                              "of the same length; check that sender and receiver agree on the codec");
    return scale;
  }
};

static_assert(concepts::compressor<int8, float> && concepts::compressor<int8, double>);

}  // namespace gradwire::compress
