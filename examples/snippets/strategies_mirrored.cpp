// docs/strategies/mirrored.md's in-process code: mirrored on threads, checked against one device.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <random>

#include "snippet_support.hpp"

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 2;
  const auto global = snippets::make_batches(Model::shape, 10, replicas * 3, seed);
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };

  // [docs:threads]
  #include <gradwire/gradwire.hpp>
  namespace gw = gradwire;

  gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
    Model model(seed);                                   // yours; parameter_views(): std::vector<gw::tensor_view<float>>
    gw::mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
        endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());
    }
  });
  // [/docs:threads]

  snippets::expect_replicas_follow("mirrored", replicas, seed, global, snippets::reference_adam(1e-3), 1e-4);
  return snippets::report("snippet strategies_mirrored", seed);
}
