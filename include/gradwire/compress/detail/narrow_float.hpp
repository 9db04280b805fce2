// Rounding to a 16-bit binary float (IEEE half, bfloat16) and back: the bit-level maths of the cast codecs.
//
// Why straight from the input's bits: a float or a double is rounded once, to nearest, ties
// to even; going through float first would round a double twice and could land one step off
// (0x1.0020000001p0 is above the half-way point of binary16 but rounds to it in float).
// Branch-free (every case computed, one chosen by selects) so that the codec loops
// vectorise; integer operations and exact float operations only (a scaling by a power of
// two, a truncation, a subtraction of its integer part), so the result does not depend on
// the floating-point environment's rounding mode.
#pragma once

#include <bit>
#include <cstdint>

namespace gradwire::compress::detail {

// The bit layout of float and double, as narrow_float reads them.
template <class V>
struct wide_float;
template <>
struct wide_float<float> {
  using bits = std::uint32_t;
  static constexpr int mantissa_bits = 23, bias = 127;
};
template <>
struct wide_float<double> {
  using bits = std::uint64_t;
  static constexpr int mantissa_bits = 52, bias = 1023;
};

// A binary format with `exponent_bits` and `mantissa_bits` (the leading 1 not stored), in 16
// bits with the sign on top: IEEE binary16 is <5, 10>, bfloat16 <8, 7>.
template <int ExponentBits, int MantissaBits>
struct narrow_float {
  static_assert(1 + ExponentBits + MantissaBits == 16, "a narrow_float fills 16 bits");
  static constexpr int bias = (1 << (ExponentBits - 1)) - 1;
  static constexpr int max_exponent = bias, min_exponent = 1 - bias;  // of normal numbers
  static constexpr std::uint32_t infinity = ((1u << ExponentBits) - 1u) << MantissaBits;
  static constexpr std::uint32_t quiet_nan = infinity | (1u << (MantissaBits - 1));

  // condition ? a : b by masks: GCC turns ?: into a branch around the float operations that
  // feed one side, may then not speculate them (they could trap), and so not vectorise.
  static std::uint32_t select(bool condition, std::uint32_t a, std::uint32_t b) noexcept {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
    return (a & mask) | (b & ~mask);
  }

  // x (float or double) rounded to nearest, ties to even; beyond the largest finite value:
  // infinity; NaN: the quiet NaN with x's sign (its payload dropped).
  template <class V>
  static std::uint16_t from(V x) noexcept {
    using W = wide_float<V>;
    using U = typename W::bits;
    constexpr int width = 8 * sizeof(U), shift = W::mantissa_bits - MantissaBits;
    constexpr U wide_infinity = ((U{1} << (width - 1 - W::mantissa_bits)) - 1) << W::mantissa_bits;
    // |x| from this on is the smallest normal / overflows to infinity (the carry past the
    // largest finite value is rounding's, below).
    constexpr U smallest_normal = static_cast<U>(min_exponent + W::bias) << W::mantissa_bits;
    constexpr U overflow = static_cast<U>(max_exponent + 1 + W::bias) << W::mantissa_bits;
    const U bits = std::bit_cast<U>(x);
    const U magnitude = bits & (wide_infinity | ((U{1} << W::mantissa_bits) - 1));
    const auto sign = static_cast<std::uint32_t>(bits >> (width - 16)) & 0x8000u;
    // Normal: re-bias the exponent in place, then round the bits below the kept ones: adding
    // half less one, plus the lowest kept bit, carries exactly when rounding goes up (a carry
    // out of the mantissa moves into the exponent: the next binade, or infinity).
    constexpr U rebias = static_cast<U>(static_cast<U>(bias) - static_cast<U>(W::bias)) << W::mantissa_bits;
    const U normal = (magnitude + rebias + ((U{1} << (shift - 1)) - 1) + ((magnitude >> shift) & 1)) >> shift;
    auto result = static_cast<std::uint32_t>(normal);
    if constexpr (min_exponent > 1 - W::bias) {
      // Subnormal here, normal in V: count units of 2^(min_exponent - MantissaBits). The
      // scaling by a power of two and the subtraction of the truncated part are exact.
      constexpr V units = [] {
        V u = 1;
        for (int i = 0; i < MantissaBits - min_exponent; ++i) u *= 2;
        return u;
      }();
      const V scaled = std::bit_cast<V>(magnitude < smallest_normal ? magnitude : smallest_normal) * units;  // <= 2^MantissaBits
      const auto whole = static_cast<std::int32_t>(scaled);
      const V fraction = scaled - static_cast<V>(whole);
      const std::int32_t above = fraction > V(0.5), tie = fraction == V(0.5);
      const std::int32_t up = above | (tie & whole);  // whole & 1 as a bool is not vectorised
      const auto subnormal = static_cast<std::uint32_t>(whole + up);
      result = select(magnitude < smallest_normal, subnormal, result);
    }
    result = select(magnitude >= overflow, infinity, result);
    result = select(magnitude > wide_infinity, quiet_nan, result);
    return static_cast<std::uint16_t>(sign | result);
  }

  // The value of `h`, exactly (every such value is a float).
  static float to(std::uint16_t h) noexcept {
    if constexpr (ExponentBits == 8) {
      return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);  // float's upper half
    } else {
      constexpr std::uint32_t exponent_mask = (1u << ExponentBits) - 1u;
      const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
      const std::uint32_t exponent = (h >> MantissaBits) & exponent_mask;
      const std::uint32_t mantissa = h & ((1u << MantissaBits) - 1u);
      const std::uint32_t normal = (static_cast<std::uint32_t>(h & 0x7FFFu) << (23 - MantissaBits)) +
                                   (static_cast<std::uint32_t>(127 - bias) << 23);
      // Infinity or NaN: the exponent field all ones in float too, the mantissa kept.
      const std::uint32_t special = normal + ((255u - (exponent_mask - bias + 127)) << 23);
      // Zero or subnormal: mantissa units of 2^(min_exponent - MantissaBits), a normal float.
      constexpr float unit = [] {
        float u = 1.0f;
        for (int i = 0; i < MantissaBits - min_exponent; ++i) u *= 0.5f;
        return u;
      }();
      const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(static_cast<float>(mantissa) * unit);
      std::uint32_t result = select(exponent == exponent_mask, special, normal);
      result = select(exponent == 0, subnormal, result);
      return std::bit_cast<float>(sign | result);
    }
  }
};

using half_bits = narrow_float<5, 10>;
using bfloat16_bits = narrow_float<8, 7>;

}  // namespace gradwire::compress::detail
