// sharded<Tensor, Optimizer, Transport>: ZeRO-1, strategy<> whose optimizer state is sharded across the replicas.
#pragma once

#include "../aggregation/sharded.hpp"
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// Synchronous training like multi_worker_mirrored, with 1/N of the optimizer state on each
// replica (aggregation::sharded): reduce-scatter, step on one's shard, all-gather.
template <class Tensor, class Optimizer, class Transport = transport::inproc>
using sharded = strategy<Tensor, Optimizer, aggregation::sharded, Transport>;

}  // namespace gradwire
