// Umbrella header of the gradwire::asio component: multi-process jobs over TCP.
//
// Cluster detection (torchrun, mpirun, Slurm, TF_CONFIG), the rendezvous store, the
// Boost.Asio TCP transport, and the strategies that run across processes. Needs Boost
// (headers) and nlohmann-json; link gradwire::asio.
#pragma once

#include "aggregation/all_reduce.hpp"
#include "cluster/spec.hpp"
#include "cluster/tcp.hpp"
#include "rendezvous/store.hpp"
#include "strategy.hpp"
#include "transport/asio_tcp.hpp"
#include "transport/wire.hpp"

namespace gradwire {

// MultiWorkerMirroredStrategy / DDP: one replica per process, synchronous all-reduce over
// TCP. Construct it with cluster::join_tcp() (the job the environment describes).
template <class Tensor, class Optimizer>
using multi_worker_mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::asio_tcp>;

}  // namespace gradwire
