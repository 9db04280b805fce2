// aggregation::all_reduce with many buckets (async, overlapped): the mean-gradient step, bit-identical replicas.
#include <catch2/catch.hpp>

#include <gradwire/gradwire.hpp>
#include <random>
#include <vector>

namespace gw = gradwire;

namespace {
// 12 tensors of mixed sizes, empty ones included; some larger than the tiny budgets below.
const std::vector<std::size_t> tensor_sizes{7, 0, 300, 1, 64, 1000, 0, 5, 129, 2048, 3, 0};

std::vector<gw::host_tensor<double>> make_params(int rank) {
  std::vector<gw::host_tensor<double>> params;
  for (std::size_t s : tensor_sizes) params.emplace_back(gw::shape{s});
  for (auto& p : params)
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.01 * double(i) + 10.0 * rank;
  return params;
}
}  // namespace

TEST_CASE("all_reduce aggregation with small buckets takes the mean-gradient step on every replica, identically") {
  const int ranks = GENERATE(2, 3, 4);
  const std::size_t bucket_bytes = GENERATE(as<std::size_t>{}, 64, 1000, 8192, gw::collective::default_bucket_bytes);
  CAPTURE(ranks, bucket_bytes);
  constexpr double lr = 0.1;
  constexpr int steps = 3;
  std::mt19937 gen(std::random_device{}());
  std::normal_distribution<double> dist;
  std::vector<std::vector<std::vector<std::vector<double>>>> grads(steps);  // [step][rank][tensor][element]
  for (auto& step : grads) {
    step.resize(ranks);
    for (auto& rank : step)
      for (std::size_t s : tensor_sizes) {
        rank.emplace_back(s);
        for (auto& g : rank.back()) g = dist(gen);
      }
  }
  using strategy = gw::strategy<gw::host_tensor<double>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::inproc>;
  std::vector<std::vector<gw::host_tensor<double>>> results(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    strategy s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}), gw::aggregation::all_reduce(bucket_bytes));
    for (int k = 0; k < steps; ++k) s.step(grads[k][t.rank()]);
    results[t.rank()].assign(s.parameters().begin(), s.parameters().end());
  });
  const auto start = make_params(0);
  for (std::size_t k = 0; k < start.size(); ++k)
    for (std::size_t i = 0; i < start[k].size(); ++i) {
      double expected = start[k][i];
      for (int step = 0; step < steps; ++step) {
        double mean = 0;
        for (int q = 0; q < ranks; ++q) mean += grads[step][q][k][i] / ranks;
        expected -= lr * mean;
      }
      for (int r = 0; r < ranks; ++r) {
        REQUIRE(results[r][k][i] == Approx(expected).epsilon(1e-12).margin(1e-12));
        REQUIRE(results[r][k][i] == results[0][k][i]);  // bit-identical replicas
      }
    }
}
