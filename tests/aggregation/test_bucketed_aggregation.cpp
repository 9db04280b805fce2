// aggregation::all_reduce with many buckets (async, overlapped): the mean-gradient step, bit-identical replicas.
#include <catch2/catch.hpp>

#include <chrono>
#include <gradwire/aggregation/detail/bucket_schedule.hpp>
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

// The rebuild after the first step adopts rank 0's order, and only rank 0's: a rank 0 that
// saw no whole first step (a gradient's hand-over failed, and the caller went on) keeps the
// reverse-index plan on every rank; another rank's partial step changes nothing.
TEST_CASE("bucket plan: the rebuild takes rank 0's first-step order, and keeps the plan when rank 0 saw no whole step") {
  const int partial_rank = GENERATE(0, 1);
  CAPTURE(partial_rank);
  const std::vector<std::size_t> sizes{3, 4, 5};
  const std::vector<std::size_t> seen_order{0, 2, 1};  // the order gradients arrive in, first step
  std::vector<std::vector<std::size_t>> plan_before(2), plan_after(2);
  std::vector<int> rebuilt(2, 0);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    using namespace std::chrono_literals;
    gw::collective::communicator comm(t, {.timeout = 60s});
    gw::aggregation::detail::bucket_schedule<double> schedule(8);  // a bucket per tensor
    schedule.plan(sizes);
    const auto me = static_cast<std::size_t>(comm.rank());
    plan_before[me].assign(schedule.layout().order().begin(), schedule.layout().order().end());
    schedule.begin_step();
    const std::size_t arriving = comm.rank() == partial_rank ? 2 : 3;
    for (std::size_t k = 0; k < arriving; ++k) {
      const std::vector<double> grad(sizes[seen_order[k]], 1.0);
      schedule.ready(seen_order[k], std::span<const double>(grad), [](std::size_t) {});
    }
    schedule.rebuild_once(comm);
    rebuilt[me] = schedule.rebuilt();
    plan_after[me].assign(schedule.layout().order().begin(), schedule.layout().order().end());
  });
  // Asserted here, on the test's thread (Catch2's assertions are not thread-safe).
  const std::vector<std::size_t> reverse_index{2, 1, 0};
  REQUIRE(plan_before[0] == reverse_index);
  REQUIRE(plan_before[1] == reverse_index);
  CHECK(rebuilt == std::vector<int>{1, 1});
  const std::vector<std::size_t> expected = partial_rank == 0 ? reverse_index : seen_order;
  CHECK(plan_after[0] == expected);
  CHECK(plan_after[1] == expected);
}
