// docs/strategies/central_storage.md's multi-process code. Run it under scripts/gradwire-run.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:processes]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/asio.hpp>
  gw::central_storage<gw::tensor_view<float>, gw::optim::adam, gw::transport::asio_tcp> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  // [/docs:processes]
  snippets::train_and_check("central_storage.md processes", model, strategy, seed, snippets::reference_adam(1e-3));
  return snippets::report("snippet strategies_central_storage_processes", seed);
}
