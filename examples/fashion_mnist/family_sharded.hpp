// The sharded family: ZeRO-1, synchronous like all-reduce with 1/N of the optimizer state per replica.
#pragma once

#include <gradwire/strategies/sharded.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// Each replica holds its own shard of the optimizer state: a checkpoint file per rank.
template <>
inline constexpr bool checkpoints_per_rank<gradwire::aggregation::sharded> = true;

struct sharded {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    model_type model({}, run.o.seed);
    gradwire::sharded<view, Optimizer, Transport> strategy(std::move(transport), model.parameter_views(), optimizer);
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
