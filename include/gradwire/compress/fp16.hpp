// compress::fp16: each element cast to IEEE binary16 (half), 2 bytes instead of 4 or 8.
//
// Why/maths: round to nearest, ties to even; a value v in the normal range [2^-14, 65504]
// comes back within |v| 2^-11 (10 stored mantissa bits). Smaller values lose relative
// precision (subnormals: an absolute error up to 2^-25) and those of magnitude 65520 or more
// become infinite: gradients rarely go there, but an unscaled loss of large magnitude can;
// bf16 keeps float's range at 2^-8 precision. Linear (concepts::compression_kind): a ring
// re-encodes partial sums, each hop rounding once more, so a sum over N ranks is within
// about N 2^-11 of the exact one, relative to the magnitudes summed. Unbiased only in the
// sense that round-to-nearest-even has no systematic direction; error_feedback<fp16> carries
// what each step lost into the next.
#pragma once

#include "../concepts.hpp"
#include "detail/cast_codec.hpp"

namespace gradwire::compress {

using fp16 = detail::cast_codec<detail::half_bits, detail::fp16_name>;

static_assert(concepts::compressor<fp16, float> && concepts::compressor<fp16, double>);

}  // namespace gradwire::compress
