// README.md's tensor_view(pointer, shape): a strategy over memory the caller owns, updated in place.
//
// The region's #include repeats the one below: under #pragma once it adds nothing, and the
// README shows which header to include.
#include <gradwire/gradwire.hpp>

#include <random>
#include <span>
#include <vector>

#include "snippet_support.hpp"

int main() {
  const unsigned seed = std::random_device{}();
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // Stands for the caller's backward pass: random gradients, kept for the check below.
  std::vector<double> wanted_weights, wanted_bias;
  auto my_backward = [&](std::vector<float>& weights, std::vector<float>& bias, std::vector<float>& weights_grad,
                         std::vector<float>& bias_grad) {
    for (auto& g : weights_grad) g = uniform(gen);
    for (auto& g : bias_grad) g = uniform(gen);
    // SGD from the current values, in float64 (lr as the float the optimizer computes with).
    const double lr = double(0.1f);
    for (std::size_t i = 0; i < weights.size(); ++i) wanted_weights.push_back(double(weights[i]) - lr * weights_grad[i]);
    for (std::size_t i = 0; i < bias.size(); ++i) wanted_bias.push_back(double(bias[i]) - lr * bias_grad[i]);
  };

  // [docs:tensor_view]
  #include <gradwire/gradwire.hpp>
  namespace gw = gradwire;

  // Memory you own; a LibTorch tensor gives its pointer as t.data_ptr<float>() (CPU, float32, contiguous).
  std::vector<float> weights(256 * 784), bias(256), weights_grad(256 * 784), bias_grad(256);
  std::vector<gw::tensor_view<float>> params{gw::tensor_view<float>(weights.data(), gw::shape{256, 784}),
                                             gw::tensor_view<float>(bias.data(), gw::shape{256})};
  std::vector<gw::tensor_view<float>> grads{gw::tensor_view<float>(weights_grad.data(), gw::shape{256, 784}),
                                            gw::tensor_view<float>(bias_grad.data(), gw::shape{256})};
  gw::one_device<gw::tensor_view<float>, gw::optim::sgd> strategy(params, gw::optim::sgd({.lr = 0.1}));

  my_backward(weights, bias, weights_grad, bias_grad);   // your code writes the gradients
  strategy.step(grads);                                  // updates weights and bias where they are
  // [/docs:tensor_view]

  snippets::expect("the strategy's parameters are the caller's memory",
                   strategy.parameters()[0].data() == weights.data() && strategy.parameters()[1].data() == bias.data());
  snippets::expect_close("weights after one SGD step, in place, against float64", std::span<const float>(weights),
                         std::span<const double>(wanted_weights), 1e-6);
  snippets::expect_close("bias after one SGD step, in place, against float64", std::span<const float>(bias),
                         std::span<const double>(wanted_bias), 1e-6);
  bool refused = false;
  try {
    gw::tensor_view<float>(nullptr, gw::shape{3});
  } catch (const gw::error& e) {
    refused = e.kind() == gw::errc::invalid_argument;
  }
  snippets::expect("a null pointer with elements is refused (invalid_argument)", refused);
  return snippets::report("snippet readme_tensor_view", seed);
}
