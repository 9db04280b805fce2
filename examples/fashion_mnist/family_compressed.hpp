// The compressed all-reduce family: mirrored / multi_worker_mirrored with --compress fp16|bf16|int8|topk:F|powersgd:R.
#pragma once

#include <stdexcept>
#include <string>

#include <gradwire/aggregation/compressed_all_reduce.hpp>
#include <gradwire/compress/codecs.hpp>
#include <gradwire/plan/codec_model.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// PowerSGD sends plain sums for its first steps (gradients change fast early on): PyTorch's
// default start_powerSGD_iter.
inline constexpr std::uint64_t powersgd_start_step = 10;

struct compressed {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    namespace compress = gradwire::compress;
    // The spelling was checked by parse() with the planner's parser: one rule for both.
    const gradwire::plan::codec_model codec = gradwire::plan::parse_codec(run.o.compress);
    if (codec.name == "fp16") return train_with(std::move(transport), optimizer, run, compress::fp16{});
    if (codec.name == "bf16") return train_with(std::move(transport), optimizer, run, compress::bf16{});
    if (codec.name == "int8") return train_with(std::move(transport), optimizer, run, compress::int8{});
    if (codec.path == gradwire::plan::codec_model::route::gather)
      return train_with(std::move(transport), optimizer, run,
                        compress::error_feedback<compress::top_k>(compress::top_k(codec.fraction)));
    if (codec.path == gradwire::plan::codec_model::route::low_rank)
      return train_with(std::move(transport), optimizer, run,
                        compress::powersgd({.rank = codec.rank, .start_step = powersgd_start_step}));
    throw std::logic_error("fashion_mnist: no codec for --compress " + run.o.compress);
  }

 private:
  template <class Transport, class Optimizer, class Codec>
  static void train_with(Transport transport, const Optimizer& optimizer, const run_context& run, Codec codec) {
    model_type model({}, run.o.seed);
    gradwire::strategy<view, Optimizer, gradwire::aggregation::compressed_all_reduce<Codec>, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer,
        gradwire::aggregation::compressed_all_reduce<Codec>(std::move(codec)));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
