// central_storage<Tensor, Optimizer, Transport>: CentralStorageStrategy, strategy<> with central aggregation.
#pragma once

#include "../aggregation/central.hpp"
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// CentralStorageStrategy: one owner rank holds the variables and applies the optimizer.
template <class Tensor, class Optimizer, class Transport = transport::inproc>
using central_storage = strategy<Tensor, Optimizer, aggregation::central, Transport>;

}  // namespace gradwire
