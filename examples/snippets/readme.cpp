// README.md's in-process code: the strategy type, training on threads, checkpoints; each checked.
//
// Regions (// [docs:NAME]) are the README's blocks, word for word (tests/docs/check_snippets.py).
// A region that starts with an #include repeats one made at the top of this file: under
// #pragma once it adds nothing, and the README shows which header to include.
#include <gradwire/gradwire.hpp>

#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "snippet_support.hpp"

using snippets::Model;

// The README's first block, with the four policies as template parameters.
template <class Tensor, class Optimizer, class Aggregation, class Transport>
constexpr bool composes_to_mirrored() {
  // [docs:strategy_type]
  #include <gradwire/gradwire.hpp>

  using S = gradwire::strategy<Tensor, Optimizer, Aggregation, Transport>;
  // [/docs:strategy_type]
  return std::is_same_v<S, gradwire::mirrored<Tensor, Optimizer>>;
}
static_assert(composes_to_mirrored<gradwire::tensor_view<float>, gradwire::optim::adam, gradwire::aggregation::all_reduce,
                                   gradwire::transport::inproc>());

// "Using it": 2 replicas of batch 4 on threads follow one device (float64) with batch 8.
void using_it(unsigned seed) {
  constexpr int replicas = 2;
  const auto global = snippets::make_batches(Model::shape, 12, replicas * 4, seed);
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };
  Model::take_finished();

  // [docs:using_it]
  namespace gw = gradwire;

  // Each replica runs on its own thread; run_inproc starts them and joins them, and if
  // one replica throws, the others stop with errc::peer_lost instead of waiting.
  gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
    Model model(seed);                                   // your model, your memory
    gw::mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
        endpoint, model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);                     // fills the gradients
      strategy.step(model.gradient_views());             // all-reduce + fused averaged Adam step
    }
  });
  // [/docs:using_it]

  snippets::expect_replicas_follow("using it", replicas, seed, global, snippets::reference_adam(1e-3), 1e-4);
}

// "Checkpoints": resumed training is bit-identical to training that never stopped.
void checkpoints(unsigned seed) {
  namespace gw = gradwire;
  const auto data = snippets::make_batches(Model::shape, 6, 4, seed + 1);
  auto train = [&](Model& model, auto& strategy, std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t k = from; k < to; ++k) {
      model.forward_backward(data[k]);
      strategy.step(model.gradient_views());
    }
  };
  std::vector<float> uninterrupted;
  {
    Model model(seed);
    gw::one_device<gw::tensor_view<float>, gw::optim::adam> strategy(model.parameter_views(),
                                                                      gw::optim::adam({.lr = 1e-3}));
    std::uint64_t step = 3;
    train(model, strategy, 0, step);
    const std::vector<float> saved = model.values();
    // [docs:checkpoints]
    if (strategy.rank() == 0) gw::save_checkpoint("run.ckpt", strategy, step);  // atomic: tmp + fsync + rename
    step = gw::load_checkpoint("run.ckpt", strategy);   // every rank, after constructing its strategy
    // [/docs:checkpoints]
    snippets::expect("checkpoints: load_checkpoint returns the saved step", step == 3);
    snippets::expect("checkpoints: loading into the same strategy changes nothing", model.values() == saved);
    train(model, strategy, step, data.size());
    uninterrupted = model.values();
  }
  {
    Model model(seed + 2);  // other initial values: the checkpoint brings everything back
    gw::one_device<gw::tensor_view<float>, gw::optim::adam> strategy(model.parameter_views(),
                                                                      gw::optim::adam({.lr = 1e-3}));
    const std::uint64_t step = gw::load_checkpoint("run.ckpt", strategy);
    train(model, strategy, step, data.size());
    snippets::expect("checkpoints: resumed training is bit-identical to training that never stopped",
                     model.values() == uninterrupted);
  }
  const auto want = snippets::reference_training(Model::shape, Model::initial_values(seed), data,
                                                 snippets::reference_adam(1e-3));
  snippets::expect_close("checkpoints: training against float64 Adam", std::span<const float>(uninterrupted),
                         std::span<const double>(want), 1e-4);
  Model::take_finished();
}

int main() {
  const unsigned seed = std::random_device{}();
  using_it(seed);
  checkpoints(seed);
  return snippets::report("snippet readme", seed);
}
