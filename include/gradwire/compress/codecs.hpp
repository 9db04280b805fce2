// Every gradient codec of gradwire::compress, and error feedback around each that takes it.
#pragma once

#include "../concepts.hpp"
#include "bf16.hpp"
#include "error_feedback.hpp"
#include "fp16.hpp"
#include "int8.hpp"
#include "powersgd.hpp"
#include "top_k.hpp"

namespace gradwire::compress {

static_assert(concepts::compressor<error_feedback<fp16>, float> && concepts::compressor<error_feedback<bf16>, float> &&
              concepts::compressor<error_feedback<int8>, float> && concepts::compressor<error_feedback<top_k>, float> &&
              concepts::compressor<error_feedback<int8>, double> && concepts::compressor<error_feedback<top_k>, double>);

}  // namespace gradwire::compress
