// docs/strategies/diloco.md's code: the alias, the options and their defaults, four replicas with AdamW inside and Nesterov outside, and streaming.
//
// The examples' #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which headers to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/compress/int8.hpp>
#include <gradwire/strategies/diloco.hpp>
#include <gradwire/collective/barrier.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <random>
#include <string>
#include <span>
#include <type_traits>
#include <vector>

#include "snippet_support.hpp"

// The alias and the options as the page states them, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, int H, class Transport = transport::inproc, class Codec = aggregation::no_codec>
using diloco = strategy<Tensor, Optimizer, aggregation::diloco_averaging<H, Codec>, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<diloco<host_tensor<float>, optim::adamw, 8, transport::inproc, compress::int8>,
                             gradwire::diloco<host_tensor<float>, optim::adamw, 8, transport::inproc, compress::int8>>);
static_assert(std::is_same_v<diloco<host_tensor<float>, optim::adamw, 8>,
                             gradwire::diloco<host_tensor<float>, optim::adamw, 8>>);
static_assert(std::is_same_v<aggregation::diloco_averaging<8>, aggregation::averaging<8, optim::momentum>>);

// [docs:options]
struct diloco_options {
  double outer_lr = 0.7;        // DiLoCo's
  double outer_momentum = 0.9;  // DiLoCo's; Nesterov always
  int fragments = 1;            // streaming: F fragments at staggered steps (1: the whole model at once)
  int delay = 0;                // streaming: steps from a fragment's all-reduce to its update, 0 <= delay < H
  std::size_t bucket_bytes = collective::default_bucket_bytes;  // the most one all-reduce call takes
};
// [/docs:options]
constexpr diloco_options page{};
constexpr aggregation::diloco_options library{};
static_assert(page.outer_lr == library.outer_lr && page.outer_momentum == library.outer_momentum &&
              page.fragments == library.fragments && page.delay == library.delay &&
              page.bucket_bytes == library.bucket_bytes && sizeof(page) == sizeof(library));
}  // namespace gradwire::docs

using snippets::Model;

namespace {
// AdamW in float64 (decoupled decay, then Adam's step), as gradwire's kernel.
struct reference_adamw : snippets::reference_adam {
  double weight_decay = 1e-2;
  explicit reference_adamw(double lr) : reference_adam(lr) {}
  void step(std::vector<double>& p, const std::vector<double>& g) {
    for (auto& x : p) x *= 1 - lr * weight_decay;
    reference_adam::step(p, g);
  }
};

// DiLoCo in float64: H inner AdamW steps per replica, then the mean of (anchor - replica)
// steps the anchor with Nesterov momentum (lr 0.7, momentum 0.9), and every replica takes it.
std::vector<std::vector<double>> reference_diloco(const std::vector<double>& start,
                                                  const std::vector<snippets::batch>& global, int replicas, int period) {
  std::vector<double> anchor = start, velocity(start.size(), 0.0);
  std::vector<std::vector<double>> p(std::size_t(replicas), start);
  std::vector<reference_adamw> inner(std::size_t(replicas), reference_adamw(1e-3));
  std::vector<std::vector<snippets::batch>> shards;
  for (int r = 0; r < replicas; ++r) shards.push_back(snippets::shard(Model::shape, global, r, replicas));
  for (std::size_t step = 1; step <= global.size(); ++step) {
    for (std::size_t r = 0; r < p.size(); ++r)
      inner[r].step(p[r], snippets::gradient(Model::shape, std::span<const double>(p[r]), shards[r][step - 1]));
    if (step % std::size_t(period) != 0) continue;
    for (std::size_t i = 0; i < start.size(); ++i) {
      double delta = 0;
      for (auto& q : p) delta += (anchor[i] - q[i]) / double(replicas);
      velocity[i] = 0.9 * velocity[i] + delta;
      anchor[i] -= 0.7 * (delta + 0.9 * velocity[i]);
      for (auto& q : p) q[i] = anchor[i];
    }
  }
  return p;
}
}  // namespace

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 4;
  const auto global = snippets::make_batches(Model::shape, 16, replicas * 2, seed);  // outer steps after 8 and 16
  auto my_shard_of_the_data = [&](int rank) { return snippets::shard(Model::shape, global, rank, replicas); };

  // [docs:example]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/strategies/diloco.hpp>
  namespace gw = gradwire;

  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    gw::diloco<gw::tensor_view<float>, gw::optim::adamw, 8> strategy(
        endpoint, model.parameter_views(), gw::optim::adamw({.lr = 1e-3}),
        gw::aggregation::diloco<8>());   // outer Nesterov: lr 0.7, momentum 0.9
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());   // an outer step after steps 8, 16, 24, ...
    }
  });
  // [/docs:example]

  const auto done = Model::take_finished();
  const auto want = reference_diloco(Model::initial_values(seed), global, replicas, 8);
  snippets::expect("every replica finished", done.size() == replicas);
  for (const auto& got : done) {
    snippets::expect("replicas are bit-identical after an outer step", got == done.front());
    snippets::expect_close("diloco<8> with AdamW inside, 4 replicas, against float64", std::span<const float>(got),
                           std::span<const double>(want.front()), 1e-4);
  }

  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    using strategy_type = gw::diloco<gw::tensor_view<float>, gw::optim::adamw, 8>;
    // [docs:streaming]
    strategy_type strategy(endpoint, model.parameter_views(), gw::optim::adamw({.lr = 1e-3}),
                           gw::aggregation::diloco<8>({.fragments = 4, .delay = 2}));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());   // fragment f all-reduced after steps 2f, 2f + 8, ...
    }
    // After the last step: the updates still pending (all-reduced, due `delay` steps later)
    // land now, and the communicator is free for collectives of your own.
    strategy.flush();
    // [/docs:streaming]
    gw::collective::barrier(strategy.communicator());
  });
  const auto streamed = Model::take_finished();
  snippets::expect("every streaming replica finished", streamed.size() == replicas);
  const auto start = Model::initial_values(seed);
  for (const auto& got : streamed)
    snippets::expect("streaming DiLoCo trains: the loss went down",
                     snippets::loss(Model::shape, std::span<const float>(got), global) <
                         snippets::loss(Model::shape, std::span<const double>(start), global));

  // Checkpoints: the streamed run again, each rank saving its own file after step 7 (fragment
  // 3, all-reduced after step 6, lands after step 8: pending), then a new job restored from
  // those files: both end with the uninterrupted run's bits.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gradwire-snippet-diloco-" + std::to_string(seed));
  std::filesystem::create_directories(dir);
  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    using strategy_type = gw::diloco<gw::tensor_view<float>, gw::optim::adamw, 8>;
    strategy_type strategy(endpoint, model.parameter_views(), gw::optim::adamw({.lr = 1e-3}),
                           gw::aggregation::diloco<8>({.fragments = 4, .delay = 2}));
    const auto data = my_shard_of_the_data(endpoint.rank());
    // [docs:checkpoint]
    for (std::size_t step = 0; step < data.size(); ++step) {
      model.forward_backward(data[step]);
      strategy.step(model.gradient_views());
      // Every rank its own file (the replicas differ), at any step, fragments in flight included.
      if (step + 1 == 7)
        gw::save_checkpoint(dir / ("rank" + std::to_string(endpoint.rank()) + ".ckpt"), strategy, step + 1);
    }
    // [/docs:checkpoint]
    strategy.flush();
  });
  auto saving = Model::take_finished();
  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed + 1);  // elsewhere: the files set every value
    using strategy_type = gw::diloco<gw::tensor_view<float>, gw::optim::adamw, 8>;
    // [docs:resume]
    // A new job: every rank builds the strategy as before, then loads its own file and goes on.
    strategy_type strategy(endpoint, model.parameter_views(), gw::optim::adamw({.lr = 1e-3}),
                           gw::aggregation::diloco<8>({.fragments = 4, .delay = 2}));
    const auto data = my_shard_of_the_data(endpoint.rank());
    for (std::size_t step = gw::load_checkpoint(dir / ("rank" + std::to_string(endpoint.rank()) + ".ckpt"), strategy);
         step < data.size(); ++step) {
      model.forward_backward(data[step]);
      strategy.step(model.gradient_views());
    }
    strategy.flush();
    // [/docs:resume]
  });
  auto resumed = Model::take_finished();
  std::filesystem::remove_all(dir);
  // Replicas end in no fixed order: compare the sets.
  auto uninterrupted = streamed;
  for (auto* run : {&uninterrupted, &saving, &resumed}) std::sort(run->begin(), run->end());
  snippets::expect("checkpointing changes nothing: the saving run ends with the uninterrupted run's bits",
                   saving == uninterrupted);
  snippets::expect("restored from per-rank checkpoints with a fragment in flight, the run ends with the "
                   "uninterrupted run's bits",
                   resumed == uninterrupted);

  gw::transport::run_inproc(4, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    // [docs:compressed]
    using strategy_type = gw::diloco<gw::tensor_view<float>, gw::optim::adamw, gw::aggregation::dynamic_period,
                                     gw::transport::inproc, gw::compress::int8>;
    strategy_type strategy(endpoint, model.parameter_views(), gw::optim::adamw({.lr = 1e-3}),
                           gw::aggregation::diloco(8, {}, gw::compress::int8{}));   // 1 byte a pseudo-gradient
    // [/docs:compressed]
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());
    }
  });
  const auto compressed = Model::take_finished();
  snippets::expect("every int8 replica finished", compressed.size() == replicas);
  for (const auto& got : compressed) {
    snippets::expect("int8 pseudo-gradients: replicas are bit-identical after an outer step", got == compressed.front());
    snippets::expect("int8 pseudo-gradients: the loss went down",
                     snippets::loss(Model::shape, std::span<const float>(got), global) <
                         snippets::loss(Model::shape, std::span<const double>(start), global));
  }
  return snippets::report("snippet strategies_diloco", seed);
}
