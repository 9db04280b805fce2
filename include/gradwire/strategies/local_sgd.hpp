// local_sgd<Tensor, Optimizer, H, Transport>: local SGD (model averaging), strategy<> with averaging<H>.
#pragma once

#include "../aggregation/averaging.hpp"
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// Local SGD / model averaging: each replica steps on its own gradient and the replicas
// average their parameters every H steps (H >= 1). H = 1 with plain SGD (or momentum)
// equals mirrored up to float rounding; optimizer state stays per replica, so Adam does not.
template <class Tensor, class Optimizer, int H, class Transport = transport::inproc>
using local_sgd = strategy<Tensor, Optimizer, aggregation::averaging<H>, Transport>;

}  // namespace gradwire
