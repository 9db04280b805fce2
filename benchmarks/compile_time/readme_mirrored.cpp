// The README's `mirrored` + Adam example as a whole one-file program: what a new user's
// first translation unit costs to compile. Not built by CMake; benchmarks/compile_time.sh
// measures it header-only and against the compiled runtime, as written (the umbrella
// header) and with -DREADME_LEAN_INCLUDES: the headers it uses, as a user who names one
// strategy includes them (no other aggregation, no parameter server, no checkpoint).
#if README_LEAN_INCLUDES
#include <gradwire/optim/adam.hpp>
#include <gradwire/strategies/mirrored.hpp>
#else
#include <gradwire/gradwire.hpp>
#endif

#include <cstdio>

#include "readme_model.hpp"

using readme::Model;
using readme::my_shard_of_the_data;

int main() {
  const unsigned seed = 1;
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
    if (endpoint.rank() == 0) std::printf("w = %g, b = %g\n", model.w[0], model.b[0]);
  });
}
