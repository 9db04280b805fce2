// one_device<Tensor, Optimizer>: OneDeviceStrategy, strategy<> with local aggregation and no communication.
#pragma once

#include "../aggregation/local.hpp"
#include "../strategy.hpp"
#include "../transport/local.hpp"

namespace gradwire {

// OneDeviceStrategy: a single replica, no communication.
template <class Tensor, class Optimizer>
using one_device = strategy<Tensor, Optimizer, aggregation::local, transport::local>;

}  // namespace gradwire
