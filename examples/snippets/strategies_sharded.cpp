// docs/strategies/sharded.md's code: the alias, and four replicas with 1/4 of Adam's state each, checked against float64.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, class Transport = transport::inproc>
using sharded = strategy<Tensor, Optimizer, aggregation::sharded, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<sharded<host_tensor<float>, optim::adam>, gradwire::sharded<host_tensor<float>, optim::adam>>);
}  // namespace gradwire::docs

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 4;
  const auto global = snippets::make_batches(Model::shape, 10, replicas * 3, seed);
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };
  std::vector<std::size_t> state_bytes(replicas);   // per replica

  // [docs:threads]
  #include <gradwire/gradwire.hpp>
  namespace gw = gradwire;

  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    gw::sharded<gw::tensor_view<float>, gw::optim::adam> strategy(
        endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());   // every replica then holds the same parameters
    }
    state_bytes[endpoint.rank()] = strategy.optimizer_state_bytes();   // about 1/4 of Adam's two moments
  });
  // [/docs:threads]

  snippets::expect_replicas_follow("sharded", replicas, seed, global, snippets::reference_adam(1e-3), 1e-4);
  const std::size_t parameters = Model::shape.parameters(), whole = 2 * parameters * sizeof(float);
  std::size_t sum = 0;
  for (auto bytes : state_bytes) {
    snippets::expect("no replica holds more than its quarter of the state (rounded up)",
                     bytes <= 2 * ((parameters + replicas - 1) / replicas) * sizeof(float));
    sum += bytes;
  }
  snippets::expect("the replicas hold Adam's two moments once between them", sum == whole);
  return snippets::report("snippet strategies_sharded", seed);
}
