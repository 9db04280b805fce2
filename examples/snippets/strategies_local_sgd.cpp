// docs/strategies/local_sgd.md's in-process code: the alias, and four replicas averaging every 8 steps.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <random>
#include <span>
#include <type_traits>

#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, int H, class Transport = transport::inproc>
using local_sgd = strategy<Tensor, Optimizer, aggregation::averaging<H>, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<local_sgd<host_tensor<float>, optim::adam, 8>,
                             gradwire::local_sgd<host_tensor<float>, optim::adam, 8>>);
static_assert(std::is_same_v<local_sgd<host_tensor<float>, optim::sgd, aggregation::dynamic_period, transport::local>,
                             gradwire::local_sgd<host_tensor<float>, optim::sgd, aggregation::dynamic_period,
                                                 transport::local>>);
}  // namespace gradwire::docs

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 4;
  const auto global = snippets::make_batches(Model::shape, 16, replicas * 2, seed);  // averaged after 8 and 16
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };

  // [docs:example]
  #include <gradwire/gradwire.hpp>
  namespace gw = gradwire;

  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    gw::local_sgd<gw::tensor_view<float>, gw::optim::adam, 8> strategy(
        endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}),
        gw::aggregation::averaging<8>().average_optimizer_state());
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());   // averages after steps 8, 16, 24, ...
    }
  });
  // [/docs:example]

  const auto done = Model::take_finished();
  const auto want = snippets::reference_local_sgd(Model::shape, Model::initial_values(seed), global, replicas, 8,
                                                  snippets::reference_adam(1e-3), /*average_optimizer_state=*/true);
  snippets::expect("every replica finished", done.size() == replicas);
  for (const auto& got : done) {
    snippets::expect("replicas are bit-identical after an averaging step", got == done.front());
    snippets::expect_close("local_sgd<8> with Adam state averaged, 4 replicas, against float64",
                           std::span<const float>(got), std::span<const double>(want.front()), 1e-4);
  }
  return snippets::report("snippet strategies_local_sgd", seed);
}
