// README.md's multi-process code: multi_worker_mirrored over TCP, and parameter servers.
// Run it under scripts/gradwire-run: `-n 2 -- snippet_readme_processes mirrored`, or
// `-n 2 --ps 1 -- snippet_readme_processes parameter_server`.
//
// A region's #includes repeat the ones below: under #pragma once they add nothing, and the
// README shows which header to include.
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>

#include <cstdint>
#include <string>

#include "ps_job.hpp"
#include "snippet_support.hpp"

namespace gw = gradwire;
using snippets::Model;

void across_processes(unsigned seed) {
  Model model(seed);
  // [docs:across_processes]
  #include <gradwire/gradwire.hpp>
  #include <gradwire/asio.hpp>   // link gradwire::asio (Boost headers, nlohmann-json)

  // Who is who comes from the environment: scripts/gradwire-run or torchrun (RANK,
  // WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun, Slurm, or a TF_CONFIG cluster spec.
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  // [/docs:across_processes]
  snippets::train_and_check("README across processes", model, strategy, seed, snippets::reference_adam(1e-3));
}

// Asynchronous parameter servers: a worker checks that training lowered its loss, a server
// that it wrote its shard's checkpoint (snippets::ps_job).
void parameter_servers(unsigned seed) {
  snippets::ps_job job(seed);  // before joining: rank 0 clears ckpt/
  auto next_batch = [&]() -> const snippets::batch& { return job.next_batch(); };
  const std::uint64_t budget = snippets::ps_job::budget;
  Model model(seed);

  // [docs:parameter_servers]
  // Launch: scripts/gradwire-run -n 4 --ps 2 -- ./train   (or a TF_CONFIG with a "ps" list)
  gw::ps::options ps;
  ps.servers = gw::cluster::detect().count(gw::cluster::task_type::ps);   // the last `servers` ranks serve
  ps.checkpoint_dir = "ckpt";  ps.checkpoint_every = 100;        // per shard; a restart resumes
  gw::parameter_server<gw::tensor_view<float>, gw::optim::adam, gw::ps::async, gw::transport::asio_tcp> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}),
      gw::aggregation::parameter_server<gw::ps::async>(ps));
  if (strategy.is_server()) {
    auto stats = strategy.serve();     // until every worker has finished (or was lost)
  } else {
    while (strategy.aggregation().applied() < budget) { model.forward_backward(next_batch()); strategy.step(model.gradient_views()); }
  }
  // [/docs:parameter_servers]

  if (strategy.is_server())
    job.expect_checkpoint_written("");
  else
    job.expect_worker_trained("asynchronous training", model, strategy.aggregation().applied());
}

int main(int argc, char** argv) {
  const unsigned seed = snippets::job_seed();
  const std::string job = argc > 1 ? argv[1] : "";
  if (job == "mirrored")
    across_processes(seed);
  else if (job == "parameter_server")
    parameter_servers(seed);
  else
    snippets::expect("usage: snippet_readme_processes mirrored|parameter_server", false);
  return snippets::report(("snippet readme_processes " + job).c_str(), seed);
}
