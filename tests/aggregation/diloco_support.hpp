// Test helper for test_diloco and test_diloco_checkpoint: the least-squares model, its data, each rank's parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <gradwire/tensor/host_tensor.hpp>
#include <random>
#include <vector>

#include "helpers/least_squares.hpp"

namespace gradwire::testing::diloco {

constexpr std::size_t inputs = 7, outputs = 3, batch = 5;
constexpr std::size_t total = outputs * inputs + outputs;  // 24 parameter elements: W, then b

inline const least_squares model{inputs, outputs, batch};

// data[step][rank], fresh random every run.
inline std::vector<std::vector<batch_data>> make_data(int steps, int ranks) {
  std::mt19937 gen(std::random_device{}());
  std::vector<std::vector<batch_data>> data(static_cast<std::size_t>(steps));
  for (auto& step : data)
    for (int r = 0; r < ranks; ++r) step.push_back(model.random_batch(gen));
  return data;
}

// Rank r starts elsewhere: the strategy's setup must broadcast rank 0's parameters.
template <class T>
std::vector<T> initial(int rank) {
  std::vector<T> p(total);
  for (std::size_t i = 0; i < outputs * inputs; ++i) p[i] = T(0.05 * std::sin(double(i) + 1.0) + 3.0 * rank);
  for (std::size_t i = 0; i < outputs; ++i) p[outputs * inputs + i] = T(0.1 * double(i) - 3.0 * rank);
  return p;
}

inline std::vector<host_tensor<float>> make_params(int rank) {
  const auto flat = initial<float>(rank);
  std::vector<host_tensor<float>> out;
  out.emplace_back(shape{outputs * inputs});
  out.emplace_back(shape{outputs});
  std::copy_n(flat.begin(), outputs * inputs, out[0].data());
  std::copy_n(flat.begin() + outputs * inputs, outputs, out[1].data());
  return out;
}

using flat_t = std::vector<float>;                   // one replica's parameters, W then b
using history_t = std::vector<std::vector<flat_t>>;  // [step][rank]

template <class Strategy>
flat_t snapshot(Strategy& s) {
  flat_t out;
  for (auto& t : s.parameters()) out.insert(out.end(), t.data(), t.data() + t.size());
  return out;
}

// One step of `s` on its own batch (rank r's of step k).
template <class Strategy>
void train_step(Strategy& s, const std::vector<std::vector<batch_data>>& data, std::size_t k, int rank) {
  auto p = s.parameters();
  s.step(model.gradients(p[0].data(), p[1].data(), data[k][static_cast<std::size_t>(rank)]));
}

}  // namespace gradwire::testing::diloco
