// The README's multi_worker_mirrored + Adam example (one replica per process over TCP,
// cluster::join_tcp()) as a whole one-file program: what a multi-process user's translation
// unit costs to compile. Not built by CMake; benchmarks/compile_time.sh measures it
// header-only and against the compiled runtime.
#include <gradwire/asio.hpp>
#include <gradwire/gradwire.hpp>

#include <cstdio>

#include "readme_model.hpp"

int main() {
  namespace gw = gradwire;
  readme::Model model;
  // Who is who comes from the environment (scripts/gradwire-run, torchrun, mpirun, Slurm, TF_CONFIG).
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  for (float x : readme::my_shard_of_the_data(strategy.rank())) {
    model.forward_backward(x);
    strategy.step(model.gradient_views());
  }
  if (strategy.rank() == 0) std::printf("w = %g, b = %g\n", model.w[0], model.b[0]);
}
