// readme_mirrored.cpp with the headers it uses instead of the umbrella: what a user who
// names one strategy compiles (no other aggregation, no parameter server, no checkpoint).
//   scripts/header-cost --no-headers --source benchmarks/compile_time/readme_mirrored_lean.cpp
#include <gradwire/optim/adam.hpp>
#include <gradwire/strategies/mirrored.hpp>
#include <gradwire/tensor/host_tensor.hpp>

#include <cstdio>
#include <vector>

namespace {

// The README's "your model": a linear layer y = w x + b fitted to y = 3x + 1.
struct Model {
  std::vector<float> w{0.0f}, b{0.0f}, dw{0.0f}, db{0.0f};
  explicit Model(unsigned) {}
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

std::vector<float> my_shard_of_the_data(int rank) {
  std::vector<float> xs;
  for (int i = 0; i < 200; ++i) xs.push_back(static_cast<float>((i * 2 + rank) % 10) / 10.0f);
  return xs;
}

}  // namespace

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
