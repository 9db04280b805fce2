// The diloco family: inner steps with --optimizer, an outer Nesterov step every --period steps (streamed with --fragments, --delay; pseudo-gradients through --compress fp16|bf16|int8).
#pragma once

#include <type_traits>

#include <gradwire/compress/bf16.hpp>
#include <gradwire/compress/fp16.hpp>
#include <gradwire/compress/int8.hpp>
#include <gradwire/strategies/diloco.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// Evaluation averages the replicas, as for local_sgd (train_replica).
template <int H>
inline constexpr bool averages_parameters<gradwire::aggregation::diloco_averaging<H>> = true;

struct diloco {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    namespace compress = gradwire::compress;
    // --compress: the pseudo-gradients through a cast codec (main.cpp allows these three).
    if (run.o.compress == "fp16") return train_with(std::move(transport), optimizer, run, compress::fp16{});
    if (run.o.compress == "bf16") return train_with(std::move(transport), optimizer, run, compress::bf16{});
    if (run.o.compress == "int8") return train_with(std::move(transport), optimizer, run, compress::int8{});
    train_with(std::move(transport), optimizer, run, gradwire::aggregation::no_codec{});
  }

 private:
  template <class Transport, class Optimizer, class Codec>
  static void train_with(Transport transport, const Optimizer& optimizer, const run_context& run, Codec codec) {
    namespace aggregation = gradwire::aggregation;
    model_type model({}, run.o.seed);
    const aggregation::diloco_options options{.outer_lr = *run.o.outer_lr,
                                              .outer_momentum = *run.o.outer_momentum,
                                              .fragments = *run.o.fragments,
                                              .delay = *run.o.delay};
    auto policy = [&] {
      if constexpr (std::is_same_v<Codec, aggregation::no_codec>)
        return aggregation::diloco(*run.o.period, options);
      else
        return aggregation::diloco(*run.o.period, options, std::move(codec));
    }();
    gradwire::diloco<view, Optimizer, aggregation::dynamic_period, Transport, Codec> strategy(
        std::move(transport), model.parameter_views(), optimizer, std::move(policy));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
