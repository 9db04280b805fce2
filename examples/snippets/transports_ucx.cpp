// docs/transports.md's code: a strategy over UCX. Run it under scripts/gradwire-run.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/ucx.hpp>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:ucx]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/ucx.hpp>   // link gradwire::ucx (Debian: libucx-dev, plus gradwire::asio's Boost and nlohmann-json)

  gw::strategy<gw::tensor_view<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::transport::ucx> strategy(
      gw::cluster::join_ucx(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  // or gw::multi_worker_mirrored_ucx<...>; central_storage, local_sgd and parameter_server
  // take the transport as their last parameter.
  // [/docs:ucx]
  snippets::train_and_check("transports.md ucx", model, strategy, seed, snippets::reference_adam(1e-3));
  return snippets::report("snippet transports_ucx", seed);
}
