// Umbrella header of the gradwire::ucx component: multi-process jobs over UCX.
//
// Everything gradwire::asio offers (cluster detection, the rendezvous store), plus the
// UCX transport: shared memory, TCP or RDMA, as UCX_TLS allows. Needs Debian's
// libucx-dev besides Boost and nlohmann-json; link gradwire::ucx.
#pragma once

#include "asio.hpp"
#include "cluster/ucx.hpp"
#include "instances/ucx.hpp"
#include "transport/ucx.hpp"

namespace gradwire {

// multi_worker_mirrored over UCX: construct it with cluster::join_ucx().
template <class Tensor, class Optimizer>
using multi_worker_mirrored_ucx = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::ucx>;

}  // namespace gradwire
