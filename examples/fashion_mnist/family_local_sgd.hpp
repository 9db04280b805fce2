// The local_sgd family: local steps, the parameters averaged every --period steps.
#pragma once

#include <gradwire/strategies/local_sgd.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// Evaluation averages local_sgd's replicas (train_replica).
template <int H>
inline constexpr bool averages_parameters<gradwire::aggregation::averaging<H>> = true;

struct local_sgd {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    namespace aggregation = gradwire::aggregation;
    model_type model({}, run.o.seed);
    gradwire::local_sgd<view, Optimizer, aggregation::dynamic_period, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer,
        aggregation::averaging<aggregation::dynamic_period>(*run.o.period));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
