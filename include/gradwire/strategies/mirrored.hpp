// mirrored<Tensor, Optimizer>: MirroredStrategy, strategy<> with synchronous all-reduce between threads.
#pragma once

#include "../aggregation/all_reduce.hpp"
#include "../instances/inproc.hpp"  // compiled mode: its collectives come from the runtime
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// MirroredStrategy: one replica per thread in this process, synchronous all-reduce.
template <class Tensor, class Optimizer>
using mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::inproc>;

}  // namespace gradwire
