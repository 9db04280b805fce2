// compress::bf16: each element cast to bfloat16 (float's upper half), 2 bytes instead of 4 or 8.
//
// Why/maths: round to nearest, ties to even, to 8 significant bits (7 stored): a normal value
// v comes back within |v| 2^-8. The exponent is float's, so nothing a float holds overflows
// (doubles beyond float's range become infinite): the safer cast where fp16's range is a
// worry, at 8x its rounding error. Linear (concepts::compression_kind): over a ring of N
// ranks each hop rounds once more, about N 2^-8 relative to the magnitudes summed.
#pragma once

#include "../concepts.hpp"
#include "detail/cast_codec.hpp"

namespace gradwire::compress {

using bf16 = detail::cast_codec<detail::bfloat16_bits, detail::bf16_name>;

static_assert(concepts::compressor<bf16, float> && concepts::compressor<bf16, double>);

}  // namespace gradwire::compress
