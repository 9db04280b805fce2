// The parameter_server family with --compress: the workers' pushes through fp16|bf16|int8|topk:F|powersgd:R, --ps-mode sync or async.
#pragma once

#include <stdexcept>
#include <string>

#include <gradwire/compress/codecs.hpp>
#include <gradwire/plan/codec_model.hpp>

#include "family_ps.hpp"

namespace fashion_mnist {

// The codecs of the compressed all-reduce (family_compressed.hpp), from the same spelling;
// PowerSGD's start step is for an all-reduce's rounds, a push compresses from the first.
// Only --ps-mode sync and async (main.cpp refuses the others with --compress): each mode
// times each codec is a strategy of its own to compile, and this translation unit has ten.
struct ps_compressed {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    namespace compress = gradwire::compress;
    using ps = parameter_server<sync_modes>;
    const gradwire::plan::codec_model codec = gradwire::plan::parse_codec(run.o.compress);
    if (codec.name == "fp16") return ps::replica(std::move(transport), optimizer, run, compress::fp16{});
    if (codec.name == "bf16") return ps::replica(std::move(transport), optimizer, run, compress::bf16{});
    if (codec.name == "int8") return ps::replica(std::move(transport), optimizer, run, compress::int8{});
    if (codec.path == gradwire::plan::codec_model::route::gather)
      return ps::replica(std::move(transport), optimizer, run,
                         compress::error_feedback<compress::top_k>(compress::top_k(codec.fraction)));
    if (codec.path == gradwire::plan::codec_model::route::low_rank)
      return ps::replica(std::move(transport), optimizer, run, compress::powersgd({.rank = codec.rank}));
    throw std::logic_error("fashion_mnist: no codec for --compress " + run.o.compress);
  }
};

}  // namespace fashion_mnist
