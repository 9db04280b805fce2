// docs/strategies/parameter_server.md's and compression.md's compressed pushes: workers push through error_feedback<int8>.
//
// Two sync workers and a server on threads. The pushes are a quarter of float's bytes plus
// a scale per piece, the pulls are float: the workers must end near the float64 reference of
// uncompressed synchronous SGD (error feedback carries what int8 rounds off into the next
// step), and lower the loss as it does.
#include <gradwire/compress/error_feedback.hpp>
#include <gradwire/compress/int8.hpp>
#include <gradwire/gradwire.hpp>

#include <cstddef>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "snippet_support.hpp"

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  namespace gw = gradwire;
  constexpr int workers = 2;
  constexpr double lr = 0.1;
  const auto global = snippets::make_batches(Model::shape, 40, 4 * std::size_t(workers), seed);
  std::vector<std::vector<snippets::batch>> shards;
  for (int w = 0; w < workers; ++w) shards.push_back(snippets::shard(Model::shape, global, w, workers));
  std::vector<std::vector<float>> after(workers);

  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    // [docs:compressed]
    gw::ps::options ps;
    ps.servers = 1;
    using codec = gw::compress::error_feedback<gw::compress::int8>;  // #include <gradwire/compress/...>
    gw::parameter_server<gw::tensor_view<float>, gw::optim::sgd, gw::ps::sync, gw::transport::inproc, codec> strategy(
        endpoint, model.parameter_views(), gw::optim::sgd({.lr = lr}),
        gw::aggregation::parameter_server<gw::ps::sync>(ps).compress(codec()));  // pulls stay float
    // [/docs:compressed]
    if (strategy.is_server()) {
      strategy.serve();
      return;
    }
    for (const auto& batch : shards[std::size_t(endpoint.rank())]) {
      model.forward_backward(batch);
      strategy.step(model.gradient_views());
    }
    after[std::size_t(endpoint.rank())] = model.values();
  });

  const auto start = Model::initial_values(seed);
  const auto want = snippets::reference_training(Model::shape, start, global, snippets::reference_sgd{lr});
  const double before = snippets::loss(Model::shape, std::span<const double>(start), global);
  const double reference = snippets::loss(Model::shape, std::span<const double>(want), global);
  for (int w = 0; w < workers; ++w) {
    const std::string who = "worker " + std::to_string(w);
    snippets::expect(who + " pulled the servers' parameters", after[std::size_t(w)] == after[0]);
    snippets::expect_close(who + ": pushes through error_feedback<int8> against float64 uncompressed SGD",
                           std::span<const float>(after[std::size_t(w)]), std::span<const double>(want), 2e-2);
    const double trained = snippets::loss(Model::shape, std::span<const float>(after[std::size_t(w)]), global);
    snippets::expect(who + " lowered the loss as uncompressed SGD does (" + std::to_string(before) + " -> " +
                         std::to_string(trained) + ", reference " + std::to_string(reference) + ")",
                     trained < before && trained < 1.05 * reference);
  }
  return snippets::report("snippet strategies_parameter_server_compressed", seed);
}
