// docs/strategies/one_device.md's code: the alias, and one replica of a 784 -> 256 linear layer.
//
// The example's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "snippet_support.hpp"

// The alias as the page states it, checked against gradwire's.
namespace gradwire::docs {
// [docs:alias]
template <class Tensor, class Optimizer>
using one_device = strategy<Tensor, Optimizer, aggregation::local, transport::local>;
// [/docs:alias]
static_assert(std::is_same_v<one_device<host_tensor<float>, optim::adam>, gradwire::one_device<host_tensor<float>, optim::adam>>);
static_assert(std::is_same_v<one_device<tensor_view<double>, optim::sgd>, gradwire::one_device<tensor_view<double>, optim::sgd>>);
}  // namespace gradwire::docs

int main() {
  const unsigned seed = std::random_device{}();
  constexpr snippets::layer layer{784, 256};
  const auto data = snippets::make_batches(layer, 5, 8, seed);
  auto my_data = [&] { return data; };
  // Gradients of the least-squares loss of y ~ W x + b at the current parameters.
  auto my_gradients = [&](std::span<gradwire::host_tensor<float>> p, const snippets::batch& d) {
    std::vector<float> wb(p[0].data(), p[0].data() + p[0].size());
    wb.insert(wb.end(), p[1].data(), p[1].data() + p[1].size());
    const auto g = snippets::gradient(layer, std::span<const float>(wb), d);
    const auto weights = g.begin() + std::ptrdiff_t(layer.weights());
    return std::vector<std::vector<float>>{{g.begin(), weights}, {weights, g.end()}};
  };
  std::vector<float> trained;

  {
    // [docs:example]
    #include <gradwire/gradwire.hpp>
    namespace gw = gradwire;

    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{256, 784});   // weights
    params.emplace_back(gw::shape{256});        // biases
    // ... initialise params[0][i], params[1][i] ...

    // No transport argument: transport::local is default-constructible.
    gw::one_device<gw::host_tensor<float>, gw::optim::momentum> strategy(
        std::move(params), gw::optim::momentum({.lr = 0.01, .momentum = 0.9}));

    for (auto& batch : my_data()) {
      std::vector<std::vector<float>> grads = my_gradients(strategy.parameters(), batch);
      strategy.step(grads);                     // one gradient per parameter tensor, same sizes, same order
    }
    // [/docs:example]
    for (auto& p : strategy.parameters()) trained.insert(trained.end(), p.data(), p.data() + p.size());
  }

  // Tensors start at zero; float64 momentum SGD from there.
  const auto want = snippets::reference_training(layer, std::vector<double>(layer.parameters(), 0.0), data,
                                                 snippets::reference_momentum(0.01, 0.9));
  snippets::expect_close("one_device momentum against float64", std::span<const float>(trained),
                         std::span<const double>(want), 1e-5);
  return snippets::report("snippet strategies_one_device", seed);
}
