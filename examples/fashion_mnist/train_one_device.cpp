// one_device: one replica, no transport.
#include <gradwire/strategies/one_device.hpp>

#include "train_loop.hpp"

fashion_mnist::summary fashion_mnist::train_one_device(const options& o, const data_set& data) {
  summary out;
  model_type model({}, o.seed);
  gradwire::one_device<view, optimizer_choice> strategy(model.parameter_views(), chosen_optimizer(o));
  train_replica(strategy, model, data, o, out);
  return out;
}
