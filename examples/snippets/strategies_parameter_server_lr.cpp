// docs/strategies/parameter_server.md's learning rate for asynchronous workers: lr / N and a schedule the servers run.
//
// Four async workers and a server on threads. Asynchronous training has no trajectory to
// compare bit for bit: the model each worker pulled last must have a lower loss than the
// start, the server must have applied the run's gradients, and the schedule must go from
// lr / N down to 0.
#include <gradwire/gradwire.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "snippet_support.hpp"

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  namespace gw = gradwire;
  constexpr int workers = 4;
  const double sync_lr = 0.05;                    // what trains well with mirrored or ps::sync
  const std::uint64_t total_gradients = 200;      // the run: gradients the servers apply
  const auto global = snippets::make_batches(Model::shape, 10, 4 * std::size_t(workers), seed);
  std::vector<std::vector<snippets::batch>> shards;
  for (int w = 0; w < workers; ++w) shards.push_back(snippets::shard(Model::shape, global, w, workers));
  const double before = snippets::loss(Model::shape, std::span<const double>(Model::initial_values(seed)), global);
  std::vector<double> after(workers, 0.0);
  std::uint64_t applied = 0;
  double lr_at_start = -1, lr_at_end = -1;

  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc endpoint) {
    Model model(seed);
    // [docs:async_lr]
    const double lr = sync_lr / workers;   // N async workers: each gradient is applied on its own, so lr / N
    gw::ps::options ps;
    ps.servers = 1;
    gw::parameter_server<gw::tensor_view<float>, gw::optim::momentum, gw::ps::async> strategy(
        endpoint, model.parameter_views(), gw::optim::momentum({.lr = lr, .momentum = 0.9}),
        gw::aggregation::parameter_server<gw::ps::async>(ps));
    // Optional: a schedule the servers run before every update (here cosine decay over the
    // run), given to serve(): an optimizer without set_lr(double) would not compile.
    const auto schedule = [=](std::uint64_t /*version*/, std::uint64_t applied) {
      const double done = std::min(1.0, double(applied) / double(total_gradients));
      return lr * 0.5 * (1.0 + std::cos(std::numbers::pi * done));
    };
    if (strategy.is_server()) applied = strategy.serve(schedule).applied;  // until every worker has finished
    // [/docs:async_lr]
    if (strategy.is_server()) {
      lr_at_start = schedule(0, 0);
      lr_at_end = schedule(0, total_gradients);
    } else {
      const auto& mine = shards[std::size_t(endpoint.rank())];
      for (std::size_t k = 0; strategy.aggregation().applied() < total_gradients; ++k) {
        model.forward_backward(mine[k % mine.size()]);
        strategy.step(model.gradient_views());
      }
      after[std::size_t(endpoint.rank())] = snippets::loss(Model::shape, std::span<const float>(model.values()), global);
    }
  });

  {
    // [docs:standby]
    gw::ps::options ps;
    ps.servers = 2;        // launched with --ps 4: the first two serve, the last two are their standbys
    ps.standby = true;     // every update replicated; a lost server's standby takes its shard over
    ps.standby_lag = 8;    // async modes: how many updates a standby may trail by (sync: 1, the step's)
    // [/docs:standby]
    snippets::expect("2 servers with standbys take 4 ranks", ps.serving_ranks() == 4);
  }
  snippets::expect("the server applied the run's gradients", applied >= total_gradients);
  snippets::expect("the schedule starts at sync_lr / workers", lr_at_start == sync_lr / workers);
  snippets::expect("the schedule ends at 0", std::abs(lr_at_end) < 1e-12);
  for (int w = 0; w < workers; ++w)
    snippets::expect("async training at lr / N lowered worker " + std::to_string(w) + "'s loss (" +
                         std::to_string(before) + " -> " + std::to_string(after[std::size_t(w)]) + ")",
                     after[std::size_t(w)] < before);
  return snippets::report("snippet strategies_parameter_server_lr", seed);
}
