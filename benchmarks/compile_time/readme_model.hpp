// The README's "your model" for the compile-time programs beside it: a linear layer
// y = w x + b fitted to y = 3x + 1, its parameters and gradients as gradwire views.
#pragma once

#include <gradwire/tensor/host_tensor.hpp>

#include <vector>

namespace readme {

struct Model {
  std::vector<float> w{0.0f}, b{0.0f}, dw{0.0f}, db{0.0f};
  explicit Model(unsigned = 0) {}
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

// Replica `rank`'s samples.
inline std::vector<float> my_shard_of_the_data(int rank) {
  std::vector<float> xs;
  for (int i = 0; i < 200; ++i) xs.push_back(static_cast<float>((i * 2 + rank) % 10) / 10.0f);
  return xs;
}

}  // namespace readme
