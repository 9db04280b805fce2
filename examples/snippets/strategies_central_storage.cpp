// docs/strategies/central_storage.md's in-process code: the alias, and three replicas on threads.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <random>
#include <type_traits>

#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, class Transport = transport::inproc>
using central_storage = strategy<Tensor, Optimizer, aggregation::central, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<central_storage<host_tensor<float>, optim::adam>,
                             gradwire::central_storage<host_tensor<float>, optim::adam>>);
static_assert(std::is_same_v<central_storage<host_tensor<float>, optim::sgd, transport::local>,
                             gradwire::central_storage<host_tensor<float>, optim::sgd, transport::local>>);
}  // namespace gradwire::docs

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 3;
  const auto global = snippets::make_batches(Model::shape, 10, replicas * 2, seed);
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };

  // [docs:example]
  #include <gradwire/gradwire.hpp>
  namespace gw = gradwire;

  gw::transport::run_inproc(3, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    gw::central_storage<gw::tensor_view<float>, gw::optim::adam> strategy(
        endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}), gw::aggregation::central(/*owner=*/2));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());
    }
  });
  // [/docs:example]

  // The owner's parameters are every replica's: the same bits everywhere.
  snippets::expect_replicas_follow("central_storage", replicas, seed, global, snippets::reference_adam(1e-3), 1e-4);
  return snippets::report("snippet strategies_central_storage", seed);
}
