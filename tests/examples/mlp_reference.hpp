// The host MLP of the Fashion-MNIST example as plain functions, for GPU tests compiled by nvcc (no Eigen there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradwire::test {

struct mlp_shapes {
  std::vector<std::vector<float>> parameters;  // W1, b1, W2, b2, W3, b3 as mlp<float>(sizes, seed) makes them
  std::vector<std::size_t> rows, cols;
};

// A small model (inputs -> hidden1 -> hidden2 -> classes) with the example's initialisation.
mlp_shapes make_mlp(std::size_t inputs, std::size_t hidden1, std::size_t hidden2, std::size_t classes,
                    std::uint64_t seed);

// Mean loss and its gradients at `parameters` over a batch (x: inputs x batch, column-major).
struct loss_and_gradients {
  double loss;
  std::vector<std::vector<float>> gradients;
};
loss_and_gradients mlp_loss_and_gradients(const mlp_shapes& model, const std::vector<float>& x,
                                          const std::vector<int>& labels);

// Samples of the batch whose arg-max class equals the label.
std::size_t mlp_count_correct(const mlp_shapes& model, const std::vector<float>& x, const std::vector<int>& labels);

}  // namespace gradwire::test
