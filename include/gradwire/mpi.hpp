// Umbrella header of the gradwire::mpi component: multi-process jobs over the site's MPI.
//
// The MPI transport and the strategies that run across processes. Needs an MPI library
// (Debian: libopenmpi-dev); link gradwire::mpi. Start the job as the site starts MPI
// jobs (mpirun, srun): ranks and sizes come from MPI, no rendezvous store is needed.
#pragma once

#include "aggregation/all_reduce.hpp"
#include "strategies.hpp"
#include "strategy.hpp"
#include "tensor/host_tensor.hpp"
#include "transport/mpi.hpp"

namespace gradwire {

// multi_worker_mirrored over MPI: construct it with transport::mpi() under mpirun.
template <class Tensor, class Optimizer>
using multi_worker_mirrored_mpi = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::mpi>;

}  // namespace gradwire
