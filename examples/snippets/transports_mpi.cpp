// docs/transports.md's code: a strategy over the site's MPI. Run it under mpirun.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/mpi.hpp>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:mpi]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/mpi.hpp>   // link gradwire::mpi (Debian: libopenmpi-dev)

  // Ranks from MPI_COMM_WORLD (duplicated); MPI is initialised at MPI_THREAD_SERIALIZED if
  // the program has not initialised it, and finalised at exit.
  gw::strategy<gw::tensor_view<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::transport::mpi> strategy(
      gw::transport::mpi(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  // or gw::multi_worker_mirrored_mpi<...>; gw::transport::mpi({.comm = my_comm}) for a
  // communicator of the program's own.
  // [/docs:mpi]
  snippets::train_and_check("transports.md mpi", model, strategy, seed, snippets::reference_adam(1e-3));
  return snippets::report("snippet transports_mpi", seed);
}
