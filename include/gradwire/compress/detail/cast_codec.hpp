// A codec that casts each element to a 16-bit float (fp16 and bf16 are this with their format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../concepts.hpp"
#include "../../kernels/host.hpp"
#include "narrow_float.hpp"
#include "payload.hpp"

namespace gradwire::compress::detail {

// Format: a narrow_float; Name: the codec's name in messages.
template <class Format, const char* Name>
class cast_codec {
 public:
  static constexpr concepts::compression_kind kind = concepts::compression_kind::linear;
  static constexpr const char* name = Name;
  using format = Format;

  // Nothing to keep between steps: the state only remembers the length it was made for.
  template <class V>
  using state = detail::length_state<V>;
  template <class V>
  state<V> init(std::size_t n) const {
    return {n};
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const noexcept {
    return 2 * n;
  }

  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    check_state(Name, s.n, in.size());
    encode(in, out);
  }
  template <class V>
  void encode(std::span<const V> in, std::span<std::byte> out) const {
    check_payload(Name, out.size(), 2 * in.size(), in.size());
    encode(in.data(), out.data(), in.size());
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    check_payload(Name, in.size(), 2 * out.size(), out.size());
    decode<false>(in.data(), out.data(), out.size());
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    check_payload(Name, in.size(), 2 * inout.size(), inout.size());
    decode<true>(in.data(), inout.data(), inout.size());
  }

 private:
  // One pass each, branch-free (narrow_float), over pointers that do not alias: vectorised.
  // In steps of a fixed 16 elements and a remainder: GCC's -O2 cost model vectorises a loop
  // of known length without `omp simd` too (one that needs a scalar remainder it refuses),
  // for a build that does not take the gradwire target's -fopenmp-simd.
  static constexpr std::size_t step = 16;
  template <class V>
  static void encode(const V* GRADWIRE_RESTRICT in, std::byte* GRADWIRE_RESTRICT out, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + step <= n; i += step)
      GRADWIRE_VECTORIZE
      for (std::size_t j = i; j < i + step; ++j) store<std::uint16_t>(out + 2 * j, Format::from(in[j]));
    for (; i < n; ++i) store<std::uint16_t>(out + 2 * i, Format::from(in[i]));
  }
  template <bool Add, class V>
  static void decode(const std::byte* GRADWIRE_RESTRICT in, V* GRADWIRE_RESTRICT out, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + step <= n; i += step)
      GRADWIRE_VECTORIZE
      for (std::size_t j = i; j < i + step; ++j) {
        const auto value = static_cast<V>(Format::to(load<std::uint16_t>(in + 2 * j)));
        out[j] = Add ? out[j] + value : value;
      }
    for (; i < n; ++i) {
      const auto value = static_cast<V>(Format::to(load<std::uint16_t>(in + 2 * i)));
      out[i] = Add ? out[i] + value : value;
    }
  }
};

template <class Format, const char* Name>
inline constexpr std::size_t elementwise_bytes<cast_codec<Format, Name>> = 2;

inline constexpr char fp16_name[] = "fp16";
inline constexpr char bf16_name[] = "bf16";

}  // namespace gradwire::compress::detail
