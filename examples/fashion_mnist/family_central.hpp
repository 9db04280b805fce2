// The central_storage family: the owner rank sums the gradients, steps and broadcasts.
#pragma once

#include <gradwire/strategies/central_storage.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

struct central {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    model_type model({}, run.o.seed);
    gradwire::central_storage<view, Optimizer, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer, gradwire::aggregation::central(*run.o.owner));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
