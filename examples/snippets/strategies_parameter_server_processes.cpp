// docs/strategies/parameter_server.md's code: the alias, and a job of workers and servers.
// Run it under scripts/gradwire-run with --ps (the last ranks serve).
//
// The example's #includes repeat the ones below: under #pragma once they add nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "ps_job.hpp"
#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer, class Mode, class Transport = transport::inproc,
          class Codec = aggregation::no_codec>  // the workers' pushes through Codec: compress(codec)
using parameter_server = strategy<Tensor, Optimizer, aggregation::parameter_server<Mode, Codec>, Transport>;
// [/docs:alias]
static_assert(std::is_same_v<parameter_server<host_tensor<float>, optim::adam, ps::sync>,
                             gradwire::parameter_server<host_tensor<float>, optim::adam, ps::sync>>);
static_assert(std::is_same_v<parameter_server<tensor_view<float>, optim::sgd, ps::async, transport::asio_tcp>,
                             gradwire::parameter_server<tensor_view<float>, optim::sgd, ps::async, transport::asio_tcp>>);
static_assert(std::is_same_v<parameter_server<tensor_view<float>, optim::sgd, ps::sync, transport::asio_tcp, int>,
                             gradwire::parameter_server<tensor_view<float>, optim::sgd, ps::sync, transport::asio_tcp, int>>);
}  // namespace gradwire::docs

using snippets::Model;

// Bounded staleness: a worker checks that training lowered its loss, a server that it wrote
// its shard's checkpoint by the time its strategy was destroyed (snippets::ps_job).
int main() {
  const unsigned seed = snippets::job_seed();
  snippets::ps_job job(seed);  // before joining: rank 0 clears ckpt/
  auto next_batch = [&]() -> const snippets::batch& { return job.next_batch(); };
  const std::uint64_t budget = snippets::ps_job::budget;
  Model model(seed);
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
    if (!served) job.expect_worker_trained("bounded-staleness training", model, strategy.aggregation().applied());
  }
  if (served) job.expect_checkpoint_written("at exit");
  return snippets::report("snippet strategies_parameter_server_processes", seed);
}
