// codec_model: a gradient codec (gradwire/compress/) as the cost model prices it: its route, its bytes on the wire, its compute.
//
// The route follows the codec's kind (concepts::compression_kind):
//   ring       fp16, bf16, int8: a ring reduce-scatter and all-gather of encoded chunks,
//              `bytes_per_element` each (4 for float: no codec)
//   gather     top-k: every rank's kept (index, value) pairs all-gathered, 8 bytes each
//   low_rank   PowerSGD: a bucket of n elements is the codec's own matrix
//              (compress::low_rank::matrix_shape), all-reduces of P (rows x r) and Q (cols x r)
// Compute: `seconds_per_element` per element of each bucket and rank for encoding and
// decoding (PowerSGD: per element and per unit of rank), from benchmarks/codecs on this
// machine's cores (docs/perf/efficient.md); the rest of a step's compute is the workload's.
#pragma once

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>

#include "../error.hpp"

namespace gradwire::plan {

struct codec_model {
  enum class route : unsigned char { ring, gather, low_rank };
  std::string name = "none";
  route path = route::ring;
  double bytes_per_element = 4;    // ring: per encoded element; gather: per kept element
  double fraction = 1;             // gather: the share of elements kept
  int rank = 0;                    // low_rank: r
  double seconds_per_element = 0;  // encode + decode on one rank (low_rank: per unit of r)

  bool compresses() const noexcept { return name != "none"; }
};

// Encode + decode per element, measured (benchmarks/codecs, 2026-12-06, one core of this
// machine, 1M-float buffers, the codecs as vectorised that day): built with g++ 12 at -O2
// and the gradwire target's own flags (-fno-math-errno -fopenmp-simd), without
// -march=native: plain x86-64 (SSE2), what a library build gets by default (the in-tree
// benchmark target adds -march=native: fp16 1.6, int8 1.4, top-k 4.3, PowerSGD 0.9 ns per
// unit of r); the median of six runs' medians, a copy of the buffer taking 0.7 ns an
// element in the same runs. The one place these numbers live.
inline constexpr double fp16_seconds_per_element = 2.5e-9;      // bf16: 1.1e-9
inline constexpr double int8_seconds_per_element = 1.9e-9;
inline constexpr double top_k_seconds_per_element = 4.2e-9;     // 1% with error feedback: its add, selection, residual
inline constexpr double low_rank_seconds_per_element = 1.1e-9;  // per unit of r: the products and the residual

// Parses --compress's spelling: none, fp16, bf16, int8, topk:FRACTION (in (0, 1]),
// powersgd:RANK (>= 1). Anything else is errc::invalid_argument naming the choices.
inline codec_model parse_codec(std::string_view text) {
  auto bad = [&](const std::string& why) -> codec_model {
    throw error(errc::invalid_argument, "--compress " + std::string(text) + ": " + why +
                                            " (none, fp16, bf16, int8, topk:FRACTION in (0, 1], powersgd:RANK >= 1)");
  };
  if (text == "none") return {};
  if (text == "fp16" || text == "bf16")
    return {std::string(text), codec_model::route::ring, 2, 1, 0, fp16_seconds_per_element};
  if (text == "int8") return {"int8", codec_model::route::ring, 1, 1, 0, int8_seconds_per_element};
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  if (colon == std::string_view::npos || (kind != "topk" && kind != "powersgd")) return bad("unknown codec");
  const std::string value(text.substr(colon + 1));
  if (kind == "topk") {
    double fraction = 0;
    try {
      std::size_t used = 0;
      fraction = std::stod(value, &used);
      if (used != value.size()) fraction = -1;
    } catch (const std::exception&) {
      fraction = -1;
    }
    if (!(fraction > 0 && fraction <= 1)) return bad("the fraction kept must be in (0, 1]");
    return {std::string(text), codec_model::route::gather, 8, fraction, 0, top_k_seconds_per_element};
  }
  int rank = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), rank);
  if (ec != std::errc{} || end != value.data() + value.size() || rank < 1) return bad("the rank must be >= 1");
  return {std::string(text), codec_model::route::low_rank, 4, 1, rank, low_rank_seconds_per_element};
}

}  // namespace gradwire::plan
