// docs/elastic.md's code: a job that shrinks past a lost rank. Run it under scripts/gradwire-run.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/aggregation/elastic_all_reduce.hpp>
#include <gradwire/asio.hpp>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = snippets::job_seed();
  snippets::Model model(seed);
  // [docs:elastic]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/aggregation/elastic_all_reduce.hpp>
  #include <gradwire/asio.hpp>

  gw::strategy<gw::tensor_view<float>, gw::optim::adam, gw::aggregation::elastic_all_reduce, gw::transport::asio_tcp>
      strategy(gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}),
               gw::aggregation::elastic_all_reduce(gw::aggregation::elastic_options{.min_replicas = 2}));
  // Train as with any strategy (strategy.step(grads)); after a loss the survivors go on, and
  // strategy.aggregation().view(), .lost_ranks() and .redone_steps() say what happened.
  // [/docs:elastic]
  snippets::train_and_check("elastic.md", model, strategy, seed, snippets::reference_adam(1e-3));
  snippets::expect("elastic.md: a job that lost nobody keeps its first view",
                   strategy.aggregation().view().epoch == 0 && strategy.aggregation().lost_ranks().empty());
  return snippets::report("snippet elastic_processes", seed);
}
