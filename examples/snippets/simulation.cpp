// docs/simulation.md's code: multi_worker_mirrored on 8 simulated workers over 2 modelled hosts, checked against one device.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/simulated.hpp>

#include <chrono>
#include <cstdio>
#include <random>

#include "snippet_support.hpp"

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 8;
  const auto global = snippets::make_batches(Model::shape, 10, replicas * 2, seed);
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };

  // [docs:example]
  #include <gradwire/transport/simulated.hpp>
  namespace gw = gradwire;
  namespace sim = gradwire::simulation;
  using namespace std::chrono_literals;

  const auto cluster = sim::parse_cluster_model(
      "hosts=2 ranks_per_host=4 bandwidth=10Gbit latency=20us compute=modelled jitter=0.1 tail=0.05:1.5");
  const sim::run_report report = sim::run(cluster, [&](gw::transport::simulated endpoint) {
    Model model(seed);
    gw::strategy<gw::tensor_view<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::transport::simulated>
        strategy(std::move(endpoint), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
    for (auto& batch : my_shard_of_the_data(strategy.rank())) {
      model.forward_backward(batch);    // real maths ...
      sim::compute(20ms);               // ... that takes 20 ms of virtual time, stretched by the stragglers
      strategy.step(model.gradient_views());
    }
  });
  std::printf("%.3f s of virtual time\n", double(report.end.count()) / 1e9);
  // [/docs:example]

  // 10 steps of at least 20 ms each, and the all-reduces take time too.
  snippets::expect("the job took at least 10 x 20 ms of virtual time", report.end >= 200ms);
  snippets::expect_replicas_follow("multi_worker_mirrored on transport::simulated", replicas, seed, global,
                                   snippets::reference_adam(1e-3), 1e-4);
  return snippets::report("snippet simulation", seed);
}
