// docs/strategies/mirrored.md's multi-process code. Run it under scripts/gradwire-run.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <chrono>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:processes]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/asio.hpp>

  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}),
      gw::aggregation::all_reduce(), gw::collective::communicator_options{.timeout = std::chrono::seconds(60)});
  // [/docs:processes]
  snippets::train_and_check("mirrored.md processes", model, strategy, seed, snippets::reference_adam(1e-3));
  return snippets::report("snippet strategies_mirrored_processes", seed);
}
