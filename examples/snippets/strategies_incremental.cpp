// docs/strategies/incremental_step.md's code: the incremental step from a backward hook, and gradient accumulation.
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

  {
    const auto global = snippets::make_batches(Model::shape, 10, replicas * 4, seed);
    auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };
    // [docs:overlap]
    #include <gradwire/gradwire.hpp>
    namespace gw = gradwire;

    gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
      Model model(seed);
      gw::mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
          endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
      for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
        auto step = strategy.begin_step();
        // Your framework's backward pass; call ready() as each gradient is final (a hook).
        model.backward(batch, [&](std::size_t i, gw::tensor_view<float> grad) { step.ready(i, grad); });
        step.finish();                                   // waits for the last buckets, applies Adam
      }
    });
    // [/docs:overlap]
    snippets::expect_replicas_follow("incremental step", replicas, seed, global, snippets::reference_adam(1e-3), 1e-4);
  }

  {
    constexpr int micro = 3;
    const auto global = snippets::make_batches(Model::shape, 6, replicas * micro * 2, seed + 1);
    auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };
    auto micro_batches = [&](const snippets::batch& d) {
      std::vector<snippets::batch> parts;
      for (int m = 0; m < micro; ++m) parts.push_back(snippets::shard(Model::shape, {d}, m, micro)[0]);
      return parts;
    };
    namespace gw = gradwire;
    // [docs:accumulation]
    gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
      Model model(seed + 1);
      gw::mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
          endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
      for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
        const auto parts = micro_batches(batch);         // K = 3 micro-batches of one batch
        for (std::size_t m = 0; m < parts.size(); ++m) {
          model.forward_backward(parts[m]);
          if (m + 1 < parts.size())
            strategy.step(model.gradient_views(), gw::no_sync);  // accumulate, no communication
          else
            strategy.step(model.gradient_views());       // one all-reduce of the mean of the K gradients
        }
      }
    });
    // [/docs:accumulation]
    snippets::expect_replicas_follow("gradient accumulation", replicas, seed + 1, global, snippets::reference_adam(1e-3),
                                     1e-4);
  }
  return snippets::report("snippet strategies_incremental", seed);
}
