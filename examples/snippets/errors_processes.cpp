// docs/errors.md's multi-process code: a shorter per-step timeout. Run it under scripts/gradwire-run.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <chrono>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:timeout]
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam(), gw::aggregation::all_reduce(),
      gw::collective::communicator_options{.timeout = std::chrono::seconds(30)});
  // [/docs:timeout]
  snippets::expect("the communicator has the timeout given",
                   strategy.communicator().options().timeout == std::chrono::seconds(30));
  snippets::train_and_check("errors.md timeout", model, strategy, seed, snippets::reference_adam());
  return snippets::report("snippet errors_processes", seed);
}
