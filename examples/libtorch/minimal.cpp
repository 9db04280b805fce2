// The smallest complete program (docs/libtorch.md shows it): a torch::nn model trained by
// multi_worker_mirrored over TCP, each gradient handed over by an autograd hook.
// Run: scripts/gradwire-run -n 2 -- libtorch_minimal   (exits 1 if the loss did not fall)
#include <cstdint>
#include <cstdio>
#include <exception>
#include <utility>

#include <torch/torch.h>

// Stand-in for a data loader: global batch k of a generated problem (noisy copies of 10
// random images), the same on every rank; a rank takes rows [rank * 32, rank * 32 + 32).
std::pair<torch::Tensor, torch::Tensor> my_batch(int rank, int k) {
  static const auto prototypes = [] {
    torch::manual_seed(7);
    return torch::rand({10, 784});
  }();
  torch::manual_seed(1000 + k);
  const auto labels = torch::randint(0, 10, {256}, torch::kLong);
  const auto images = 0.5 * prototypes.index_select(0, labels) + 0.5 * torch::rand({256, 784});
  return {images.narrow(0, rank * 32, 32), labels.narrow(0, rank * 32, 32)};
}

int train();

int main() {
  try {
    return train();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_minimal: %s\n", e.what());
    return 1;
  }
}

// [docs:minimal]
#include <torch/torch.h>
#include <gradwire/gradwire.hpp>
#include <gradwire/asio.hpp>      // multi_worker_mirrored, join_tcp: link gradwire::asio
#include "torch_bridge.hpp"       // examples/libtorch

namespace gw = gradwire;

int train() {
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(784, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
  torch_bridge::module_bridge bridge(*model);   // .grad allocated once; a hook per parameter
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::momentum> strategy(
      gw::cluster::join_tcp(), bridge.parameter_views(), gw::optim::momentum({.lr = 0.05}));
  float first = 0, last = 0;
  for (int k = 0; k < 50; ++k) {
    auto [x, y] = my_batch(strategy.rank(), k);   // this rank's share of global batch k
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    auto step = strategy.begin_step();
    bridge.backward(loss, step);   // step.ready(i, grad i) from inside backward, as each is accumulated
    step.finish();                 // waits for the last reductions, applies the averaged update
    bridge.zero_grad();            // in place, ready for the next backward
    (k == 0 ? first : last) = loss.item<float>();
  }
  std::printf("rank %d: loss %.3f -> %.3f\n", strategy.rank(), first, last);
  return last < first ? 0 : 1;
}
// [/docs:minimal]
