// docs/strategies/parameter_server.md's code: the alias, and a job of workers and servers.
// Run it under scripts/gradwire-run with --ps (the last ranks serve).
//
// The example's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, class Mode, class Transport = transport::inproc>
using parameter_server = strategy<Tensor, Optimizer, aggregation::parameter_server<Mode>, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<parameter_server<host_tensor<float>, optim::adam, ps::sync>,
                             gradwire::parameter_server<host_tensor<float>, optim::adam, ps::sync>>);
static_assert(std::is_same_v<parameter_server<tensor_view<float>, optim::sgd, ps::async, transport::asio_tcp>,
                             gradwire::parameter_server<tensor_view<float>, optim::sgd, ps::async, transport::asio_tcp>>);
}  // namespace gradwire::docs

using snippets::Model;

// Bounded staleness: nothing to compare bit for bit, so a worker checks that training
// lowered the loss on its data, and a server that it wrote its shard's checkpoint.
int main() {
  const unsigned seed = snippets::job_seed();
  const gradwire::cluster::cluster_spec job = gradwire::cluster::detect();
  if (job.rank == 0) {  // a fresh job: no checkpoint of an earlier run to resume from
    std::error_code ignored;
    std::filesystem::remove_all("ckpt", ignored);
  }
  const int workers = job.world_size - job.count(gradwire::cluster::task_type::ps);
  const std::vector<snippets::batch> data =
      snippets::shard(Model::shape, snippets::make_batches(Model::shape, 8, 4 * std::size_t(workers), seed + 1),
                      std::min(job.rank, workers - 1), workers);
  std::size_t next = 0;
  auto next_batch = [&]() -> const snippets::batch& { return data[next++ % data.size()]; };
  const std::uint64_t budget = 60;
  Model model(seed);
  const double before = snippets::loss(Model::shape, std::span<const float>(model.values()), data);
  double after = before;
  bool served = false;
  {
    // [docs:example]
    #include <gradwire/gradwire.hpp>
    #include <gradwire/asio.hpp>
    namespace gw = gradwire;

    gw::ps::options ps;
    ps.servers = gw::cluster::detect().count(gw::cluster::task_type::ps);
    ps.checkpoint_dir = "ckpt";
    ps.checkpoint_every = 100;
    gw::parameter_server<gw::tensor_view<float>, gw::optim::adam, gw::ps::bounded_staleness<2>, gw::transport::asio_tcp>
        strategy(gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}),
                 gw::aggregation::parameter_server<gw::ps::bounded_staleness<2>>(ps));
    if (strategy.is_server()) {
      gw::ps::server_stats stats = strategy.serve();   // until every worker has finished or was lost
      std::printf("p99 staleness %llu\n", (unsigned long long)gw::ps::histogram_quantile(stats.staleness, 0.99));
    } else {
      while (strategy.aggregation().applied() < budget) {
        model.forward_backward(next_batch());
        strategy.step(model.gradient_views());
      }
    }   // the worker's destructor tells the servers it has finished
    // [/docs:example]
    served = strategy.is_server();
    if (!served) {
      snippets::expect("the worker's loop ended once the servers had applied the budget",
                       strategy.aggregation().applied() >= budget);
      after = snippets::loss(Model::shape, std::span<const float>(model.values()), data);
    }
  }
  if (served) {
    const int servers = job.count(gradwire::cluster::task_type::ps);
    const int shard = job.rank - (job.world_size - servers);
    const auto file = "ckpt/ps-shard-" + std::to_string(shard) + "-of-" + std::to_string(servers) + ".ckpt";
    snippets::expect("the server wrote " + file + " at exit", std::filesystem::exists(file));
  } else {
    snippets::expect("bounded-staleness training lowered the worker's loss (" + std::to_string(before) + " -> " +
                         std::to_string(after) + ")",
                     after < before);
  }
  return snippets::report("snippet strategies_parameter_server_processes", seed);
}
