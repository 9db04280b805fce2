// docs/strategies/local_sgd.md's multi-process code: a period chosen at run time, over TCP.
// Run it under scripts/gradwire-run.
//
// The region's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <cstdlib>
#include <span>

#include "snippet_support.hpp"

namespace gw = gradwire;
using snippets::Model;

int main(int argc, char** argv) {
  const unsigned seed = snippets::job_seed();
  const int period = argc > 1 ? std::atoi(argv[1]) : 4;
  Model model(seed);
  // [docs:dynamic_period]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/asio.hpp>
  namespace agg = gw::aggregation;
  gw::local_sgd<gw::tensor_view<float>, gw::optim::momentum, agg::dynamic_period, gw::transport::asio_tcp> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::momentum({.lr = 0.01}),
      agg::averaging<agg::dynamic_period>(period));
  // [/docs:dynamic_period]
  snippets::expect("the period is the one given", strategy.aggregation().every() == period);

  // 3 periods of local steps; the replicas agree after the last one.
  const int replicas = strategy.size();
  const auto global = snippets::make_batches(Model::shape, 3 * std::size_t(period), 4 * std::size_t(replicas), seed + 1);
  for (const auto& d : snippets::shard(Model::shape, global, strategy.rank(), replicas)) {
    model.forward_backward(d);
    strategy.step(model.gradient_views());
  }
  const auto want = snippets::reference_local_sgd(Model::shape, Model::initial_values(seed), global, replicas, period,
                                                  snippets::reference_momentum(0.01, 0.9),
                                                  /*average_optimizer_state=*/false);
  snippets::expect_close("local_sgd with a run-time period against float64", std::span<const float>(model.values()),
                         std::span<const double>(want[std::size_t(strategy.rank())]), 1e-4);
  return snippets::report("snippet strategies_local_sgd_processes", seed);
}
