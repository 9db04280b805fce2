// The all-reduce family: mirrored over inproc, multi_worker_mirrored over asio_tcp or ucx.
#pragma once

#include <gradwire/aggregation/all_reduce.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

struct all_reduce {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    model_type model({}, run.o.seed);
    gradwire::strategy<view, Optimizer, gradwire::aggregation::all_reduce, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer,
        gradwire::aggregation::all_reduce(gradwire::aggregation::all_reduce_options{.backup_workers = run.o.backup_workers}));
    train_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
