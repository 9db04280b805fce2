// Rounding to a 16-bit binary float (IEEE half, bfloat16) and back: the bit-level maths of the cast codecs.
//
// Why from double: a float converts to double exactly, so one rounding step serves float and
// double inputs alike; rounding a double through float first would round twice and could
// land one step off round-to-nearest-even (0x1.0020000001p0 is above the half-way point of
// binary16 but rounds to it in float). Integer operations only: the result does not depend
// on the floating-point environment's rounding mode.
#pragma once

#include <bit>
#include <cstdint>

namespace gradwire::compress::detail {

// A binary format with `exponent_bits` and `mantissa_bits` (the leading 1 not stored), in 16
// bits with the sign on top: IEEE binary16 is <5, 10>, bfloat16 <8, 7>.
template <int ExponentBits, int MantissaBits>
struct narrow_float {
  static_assert(1 + ExponentBits + MantissaBits == 16, "a narrow_float fills 16 bits");
  static constexpr int bias = (1 << (ExponentBits - 1)) - 1;
  static constexpr int max_exponent = bias, min_exponent = 1 - bias;  // of normal numbers
  static constexpr std::uint32_t infinity = ((1u << ExponentBits) - 1u) << MantissaBits;

  // x rounded to nearest, ties to even; beyond the largest finite value: infinity; NaN stays
  // NaN (quiet), with its sign.
  static std::uint16_t from(double x) noexcept {
    const auto bits = std::bit_cast<std::uint64_t>(x);
    const auto sign = static_cast<std::uint32_t>(bits >> 63) << 15;
    const std::uint64_t magnitude = bits & 0x7FFF'FFFF'FFFF'FFFFull;
    if (magnitude >= 0x7FF0'0000'0000'0000ull)  // infinity or NaN
      return static_cast<std::uint16_t>(sign | infinity |
                                        (magnitude > 0x7FF0'0000'0000'0000ull ? 1u << (MantissaBits - 1) : 0u));
    const int exponent = static_cast<int>(magnitude >> 52) - 1023;
    if (exponent > max_exponent) return static_cast<std::uint16_t>(sign | infinity);
    const std::uint64_t significand = (magnitude & 0x000F'FFFF'FFFF'FFFFull) | (1ull << 52);
    // Normal: keep MantissaBits below the leading 1. Subnormal: count units of
    // 2^(min_exponent - MantissaBits). A carry out of the kept bits moves into the exponent
    // field, which is the right next value (the smallest normal, or infinity past the largest).
    const int shift = exponent >= min_exponent ? 52 - MantissaBits : 52 - MantissaBits + min_exponent - exponent;
    if (shift > 53) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal (double subnormals too)
    std::uint64_t kept = significand >> shift;
    const std::uint64_t rest = significand & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) ++kept;
    std::uint64_t field = kept;
    if (exponent >= min_exponent)
      field = (static_cast<std::uint64_t>(exponent + bias) << MantissaBits) + (kept - (1ull << MantissaBits));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(field));
  }

  // The value of `h`, exactly (every such value is a float).
  static float to(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h >> 15) << 31;
    const std::uint32_t exponent = (h >> MantissaBits) & ((1u << ExponentBits) - 1u);
    const std::uint32_t mantissa = h & ((1u << MantissaBits) - 1u);
    if (exponent == (1u << ExponentBits) - 1u)  // infinity or NaN
      return std::bit_cast<float>(sign | 0x7F80'0000u | (mantissa << (23 - MantissaBits)));
    if (exponent == 0) {  // zero or subnormal: mantissa units of 2^(min_exponent - MantissaBits)
      constexpr float unit = [] {  // 2^-24 or 2^-133: the latter is itself subnormal in float
        float u = 1.0f;
        for (int i = 0; i < MantissaBits - min_exponent; ++i) u *= 0.5f;
        return u;
      }();
      const float value = static_cast<float>(mantissa) * unit;
      return sign ? -value : value;
    }
    return std::bit_cast<float>(sign | ((exponent - bias + 127) << 23) | (mantissa << (23 - MantissaBits)));
  }
};

using half_bits = narrow_float<5, 10>;
using bfloat16_bits = narrow_float<8, 7>;

}  // namespace gradwire::compress::detail
