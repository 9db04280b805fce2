// strategy<>: replicas start equal, end equal, and take the averaged step; bad input is refused.
#include <catch2/catch.hpp>

#include <type_traits>
#include <gradwire/gradwire.hpp>
#include <random>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;

namespace {
std::vector<gw::host_tensor<double>> make_params(int rank) {
  std::vector<gw::host_tensor<double>> params;
  params.emplace_back(gw::shape{3, 4});
  params.emplace_back(gw::shape{5});
  params.emplace_back(gw::shape{0});  // empty tensors are legal
  for (auto& p : params)
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.1 * double(i) + 10.0 * rank;
  return params;
}
}  // namespace

TEST_CASE("mirrored replicas start from rank 0's parameters and take the mean-gradient step") {
  constexpr int ranks = 3;
  constexpr double lr = 0.2;
  std::vector<std::vector<std::vector<double>>> grads(ranks);  // [rank][tensor][element]
  std::mt19937 gen(std::random_device{}());
  std::normal_distribution<double> dist;
  const auto shapes = make_params(0);
  for (int r = 0; r < ranks; ++r)
    for (auto& p : shapes) {
      grads[r].emplace_back(p.size());
      for (auto& g : grads[r].back()) g = dist(gen);
    }
  std::vector<std::vector<gw::host_tensor<double>>> results(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::mirrored<gw::host_tensor<double>, gw::optim::sgd> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}));
    s.step(grads[t.rank()]);
    results[t.rank()].assign(s.parameters().begin(), s.parameters().end());
  });
  const auto start = make_params(0);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t k = 0; k < start.size(); ++k)
      for (std::size_t i = 0; i < start[k].size(); ++i) {
        double mean = 0;
        for (int q = 0; q < ranks; ++q) mean += grads[q][k][i] / ranks;
        REQUIRE(results[r][k][i] == Approx(start[k][i] - lr * mean).epsilon(1e-12));
        REQUIRE(results[r][k][i] == results[0][k][i]);
      }
}

TEST_CASE("step refuses gradients that do not match the parameters") {
  gw::one_device<gw::host_tensor<double>, gw::optim::sgd> s(make_params(0));
  // A local invalid_argument (docs/errors.md, "Tensors passed to a step").
  SECTION("wrong number of tensors") {
    std::vector<std::vector<double>> grads{std::vector<double>(12)};
    const auto [kind, what] = gw::testing::error_of([&] { s.step(grads); });
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE_THAT(what, Catch::Contains("strategy::step: got 1 gradient tensors for 3 parameter tensors"));
  }
  SECTION("wrong size of one tensor") {
    std::vector<std::vector<double>> grads{std::vector<double>(12), std::vector<double>(4), {}};
    const auto [kind, what] = gw::testing::error_of([&] { s.step(grads); });
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE_THAT(what, Catch::Contains("strategy::step: gradient 1 has 4 elements but parameter 1 has 5"));
  }
  // Nothing was applied by the refused steps.
  REQUIRE(s.parameters()[1][4] == 0.4);
}

TEST_CASE("one_device applies the optimizer to views over the user's memory") {
  std::vector<float> weights{1.0f, -2.0f, 3.0f};
  std::vector<gw::tensor_view<float>> params{gw::tensor_view<float>(std::span<float>(weights))};
  gw::one_device<gw::tensor_view<float>, gw::optim::momentum> s(params, gw::optim::momentum({.lr = 0.5, .momentum = 0.5}));
  std::vector<float> g{2.0f, 2.0f, -2.0f};
  std::vector<gw::tensor_view<float>> grads{gw::tensor_view<float>(std::span<float>(g))};
  s.step(grads);  // v = g, p -= 0.5 g
  s.step(grads);  // v = 0.5 g + g, p -= 0.5 * 1.5 g
  REQUIRE(weights == std::vector<float>{1.0f - 2.5f, -2.0f - 2.5f, 3.0f + 2.5f});
}

// A copy would share sequence numbers (message tags) with the original and, through its
// parameter spans, update the original's weights: strategies and communicators move only.
static_assert(!std::is_copy_constructible_v<gradwire::mirrored<gradwire::host_tensor<float>, gradwire::optim::sgd>>);
static_assert(std::is_move_constructible_v<gradwire::mirrored<gradwire::host_tensor<float>, gradwire::optim::sgd>>);
static_assert(!std::is_copy_constructible_v<gradwire::collective::communicator<gradwire::transport::inproc>>);
