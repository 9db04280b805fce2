// multi_worker_mirrored<Tensor, Optimizer>: MultiWorkerMirroredStrategy / DDP, strategy<> with all-reduce over TCP.
//
// Component gradwire::asio (Boost headers, nlohmann-json). Construct it with
// cluster::join_tcp() (<gradwire/cluster/tcp.hpp>): the job the environment describes.
#pragma once

#include "../aggregation/all_reduce.hpp"
#include "../instances/asio_tcp.hpp"  // compiled mode: its collectives come from the runtime
#include "../strategy.hpp"
#include "../transport/asio_tcp.hpp"

namespace gradwire {

// MultiWorkerMirroredStrategy / DDP: one replica per process, synchronous all-reduce over
// TCP. Construct it with cluster::join_tcp() (the job the environment describes).
template <class Tensor, class Optimizer>
using multi_worker_mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::asio_tcp>;

}  // namespace gradwire
