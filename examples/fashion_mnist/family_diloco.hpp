// The diloco family: inner steps with --optimizer, an outer Nesterov step every --period steps (streamed with --fragments, --delay).
#pragma once

#include <gradwire/strategies/diloco.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// Evaluation averages the replicas, as for local_sgd (train_replica).
template <int H>
inline constexpr bool averages_parameters<gradwire::aggregation::diloco_averaging<H>> = true;

struct diloco {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    namespace aggregation = gradwire::aggregation;
    model_type model({}, run.o.seed);
    gradwire::diloco<view, Optimizer, aggregation::dynamic_period, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer,
        aggregation::diloco(*run.o.period, {.outer_lr = *run.o.outer_lr,
                                            .outer_momentum = *run.o.outer_momentum,
                                            .fragments = *run.o.fragments,
                                            .delay = *run.o.delay}));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
