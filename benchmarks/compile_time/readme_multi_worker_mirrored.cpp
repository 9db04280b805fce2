// The README's multi_worker_mirrored + Adam example (one replica per process over TCP,
// cluster::join_tcp()) as a whole one-file program: what a multi-process user's translation
// unit costs to compile. Not built by CMake; benchmarks/compile_time.sh measures it
// header-only and against the compiled runtime.
#include <gradwire/asio.hpp>
#include <gradwire/gradwire.hpp>

#include <cstdio>
#include <vector>

namespace {

// The README's "your model": a linear layer y = w x + b fitted to y = 3x + 1.
struct Model {
  std::vector<float> w{0.0f}, b{0.0f}, dw{0.0f}, db{0.0f};
  std::vector<gradwire::tensor_view<float>> parameter_views() {
    return {gradwire::tensor_view<float>(w.data(), gradwire::shape{1}),
            gradwire::tensor_view<float>(b.data(), gradwire::shape{1})};
  }
  std::vector<gradwire::tensor_view<float>> gradient_views() {
    return {gradwire::tensor_view<float>(dw.data(), gradwire::shape{1}),
            gradwire::tensor_view<float>(db.data(), gradwire::shape{1})};
  }
  void forward_backward(float x) {
    const float err = w[0] * x + b[0] - (3.0f * x + 1.0f);
    dw[0] = 2 * err * x;
    db[0] = 2 * err;
  }
};

}  // namespace

int main() {
  namespace gw = gradwire;
  Model model;
  // Who is who comes from the environment (scripts/gradwire-run, torchrun, mpirun, Slurm, TF_CONFIG).
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(
      gw::cluster::join_tcp(), model.parameter_views(), gw::optim::adam({.lr = 1e-3}));
  for (int i = 0; i < 200; ++i) {
    model.forward_backward(static_cast<float>((i * 2 + strategy.rank()) % 10) / 10.0f);
    strategy.step(model.gradient_views());
  }
  if (strategy.rank() == 0) std::printf("w = %g, b = %g\n", model.w[0], model.b[0]);
}
