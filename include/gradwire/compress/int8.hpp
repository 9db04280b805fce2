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
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "detail/payload.hpp"

namespace gradwire::compress {

class int8 {
 public:
  static constexpr concepts::compression_kind kind = concepts::compression_kind::linear;
  static constexpr const char* name = "int8";

  // Nothing to keep between steps: the state only remembers the length it was made for.
  template <class V>
  struct state {
    std::size_t n = 0;
  };
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
    double largest = 0;
    double poison = 0;  // std::max drops a NaN: a NaN or an infinity shows here instead
    for (const V x : in) {
      const double m = std::fabs(static_cast<double>(x));
      largest = std::max(largest, m);
      poison += static_cast<double>(x) * 0;  // NaN for a NaN or an infinity, 0 otherwise
    }
    const auto scale = static_cast<float>(largest / 127);
    if (!(poison == 0) || !std::isfinite(scale))
      throw error(errc::invalid_argument,
                  "gradwire::compress::int8: the buffer holds NaN, an infinity, or a magnitude beyond float's "
                  "range times 127, so its scale max|x|/127 is not a finite float; find where the gradients "
                  "diverge (strategy<>'s finite check names the tensor), or use bf16, which carries them");
    detail::store<float>(out.data(), scale);
    std::byte* to = out.data() + sizeof(float);
    const double divisor = scale > 0 ? static_cast<double>(scale) : 1.0;  // scale 0: every x is 0
    for (std::size_t i = 0; i < in.size(); ++i) {
      // A division, not a product with 1/scale, whose rounding could move a tie. nearbyint:
      // ties to even in the default rounding mode; the clamp guards the last ulp.
      const double q = std::clamp(std::nearbyint(static_cast<double>(in[i]) / divisor), -127.0, 127.0);
      to[i] = static_cast<std::byte>(static_cast<std::int8_t>(q));
    }
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    const double scale = checked_scale<V>(in, out.size());
    const std::byte* from = in.data() + sizeof(float);
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<V>(static_cast<double>(static_cast<std::int8_t>(from[i])) * scale);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    const double scale = checked_scale<V>(in, inout.size());
    const std::byte* from = in.data() + sizeof(float);
    for (std::size_t i = 0; i < inout.size(); ++i)
      inout[i] += static_cast<V>(static_cast<double>(static_cast<std::int8_t>(from[i])) * scale);
  }

 private:
  template <class V>
  double checked_scale(std::span<const std::byte> in, std::size_t n) const {
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
