// local_sgd (aggregation::averaging<H>): H = 1 matches mirrored, replicas re-agree every H steps on the mean.
#include <catch2/catch.hpp>

#include "helpers/least_squares.hpp"
#include "helpers/plain_sgd.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <gradwire/gradwire.hpp>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace gw = gradwire;

static_assert(gw::concepts::aggregation<gw::aggregation::averaging<4>, float, gw::transport::inproc>);
static_assert(gw::concepts::aggregation<gw::aggregation::averaging<>, double, gw::transport::local>);
static_assert(gw::aggregation::averaging<4>::period == 4);
static_assert(gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, 8>::aggregation_type::period == 8);
// The period is either in the type or given to the constructor, never both or neither.
static_assert(std::is_default_constructible_v<gw::aggregation::averaging<1>>);
static_assert(!std::is_default_constructible_v<gw::aggregation::averaging<>>);
static_assert(!std::is_constructible_v<gw::aggregation::averaging<2>, int, std::size_t>);
static_assert(!std::is_constructible_v<gw::aggregation::averaging<2>, int>);  // a period twice, not a budget
static_assert(std::is_constructible_v<gw::aggregation::averaging<2>, std::size_t>);

namespace {
// A linear least-squares model y = W x + b, loss 0.5 * mean over the batch of |W x + b - y|^2.
constexpr std::size_t inputs = 7, outputs = 3, batch = 5;

using gradwire::testing::batch_data;
const gradwire::testing::least_squares model{inputs, outputs, batch};

// data[step][rank], fresh random every run.
std::vector<std::vector<batch_data>> make_data(int steps, int ranks) {
  std::mt19937 gen(std::random_device{}());
  std::vector<std::vector<batch_data>> data(steps);
  for (auto& step : data)
    for (int r = 0; r < ranks; ++r) step.push_back(model.random_batch(gen));
  return data;
}

// Rank r starts elsewhere: the strategy's setup must broadcast rank 0's parameters.
template <class T>
std::vector<std::vector<T>> initial(int rank) {
  std::vector<std::vector<T>> p{std::vector<T>(outputs * inputs), std::vector<T>(outputs)};
  for (std::size_t i = 0; i < p[0].size(); ++i) p[0][i] = T(0.05 * std::sin(double(i) + 1.0) + 3.0 * rank);
  for (std::size_t i = 0; i < p[1].size(); ++i) p[1][i] = T(0.1 * double(i) - 3.0 * rank);
  return p;
}

std::vector<gw::host_tensor<float>> make_params(int rank) {
  std::vector<gw::host_tensor<float>> out;
  for (const auto& v : initial<float>(rank)) {
    out.emplace_back(gw::shape{v.size()});
    std::copy(v.begin(), v.end(), out.back().data());
  }
  return out;
}

template <class T>
std::vector<std::vector<T>> gradients(const T* w, const T* b, const batch_data& d) {
  return model.gradients(w, b, d);
}

using params_t = std::vector<std::vector<float>>;  // [tensor][element]

template <class Strategy>
params_t snapshot(Strategy& s) {
  params_t out;
  for (auto& t : s.parameters()) out.emplace_back(t.data(), t.data() + t.size());
  return out;
}

// Trains `steps` steps on every rank; history[step][rank] holds the parameters after each
// step. The aggregation (move-only: it owns its buffer) is built on each rank from `args`.
template <class Strategy, class Optimizer, class... Args>
std::vector<std::vector<params_t>> train(int ranks, const std::vector<std::vector<batch_data>>& data,
                                         Optimizer optimizer, Args... args) {
  const int steps = static_cast<int>(data.size());
  std::vector<std::vector<params_t>> history(steps, std::vector<params_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    Strategy s(t, make_params(t.rank()), optimizer, typename Strategy::aggregation_type(args...));
    for (int k = 0; k < steps; ++k) {
      auto p = s.parameters();
      s.step(gradients(p[0].data(), p[1].data(), data[k][t.rank()]));
      history[k][t.rank()] = snapshot(s);
    }
  });
  return history;
}

bool all_equal(const std::vector<params_t>& replicas) {
  return std::all_of(replicas.begin(), replicas.end(), [&](const params_t& p) { return p == replicas[0]; });
}
}  // namespace

TEST_CASE("local_sgd<1> with plain SGD trains like mirrored (synchronous gradient averaging)") {
  const int ranks = GENERATE(2, 3, 4);
  CAPTURE(ranks);
  constexpr int steps = 6;
  const auto data = make_data(steps, ranks);
  const gw::optim::sgd sgd({.lr = 0.1});
  const auto local = train<gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, 1>>(ranks, data, sgd);
  const auto mirrored = train<gw::mirrored<gw::host_tensor<float>, gw::optim::sgd>>(ranks, data, sgd);
  for (int k = 0; k < steps; ++k) {
    REQUIRE(all_equal(local[k]));  // averaged after every step
    for (std::size_t t = 0; t < mirrored[k][0].size(); ++t)
      for (std::size_t i = 0; i < mirrored[k][0][t].size(); ++i)
        REQUIRE(local[k][0][t][i] == Approx(mirrored[k][0][t][i]).epsilon(1e-5).margin(1e-6));
  }
  // The replicas moved away from rank 0's start: the comparison above is not vacuous.
  REQUIRE(local.back()[0][1][0] != initial<float>(0)[1][0]);
}

// What the header documents: optimizer state stays local. For momentum (linear in the
// gradient) that still matches mirrored at H = 1; for Adam it does not.
TEST_CASE("local_sgd<1> matches mirrored with momentum but not with Adam (optimizer state stays local)") {
  constexpr int ranks = 3, steps = 5;
  const auto data = make_data(steps, ranks);
  SECTION("momentum, Nesterov and weight decay: equal up to rounding") {
    const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01});
    const auto local = train<gw::local_sgd<gw::host_tensor<float>, gw::optim::momentum, 1>>(ranks, data, opt);
    const auto mirrored = train<gw::mirrored<gw::host_tensor<float>, gw::optim::momentum>>(ranks, data, opt);
    for (std::size_t t = 0; t < mirrored.back()[0].size(); ++t)
      for (std::size_t i = 0; i < mirrored.back()[0][t].size(); ++i)
        REQUIRE(local.back()[0][t][i] == Approx(mirrored.back()[0][t][i]).epsilon(1e-5).margin(1e-6));
  }
  SECTION("Adam: the mean of per-replica normalised steps is not the normalised mean") {
    // Adam's first step is about lr * sign(g): the mean of the replicas' signs differs
    // from the sign of the mean gradient by >= 2/3 lr wherever the replicas disagree.
    const gw::optim::adam opt({.lr = 0.01});
    const auto local = train<gw::local_sgd<gw::host_tensor<float>, gw::optim::adam, 1>>(ranks, data, opt);
    const auto mirrored = train<gw::mirrored<gw::host_tensor<float>, gw::optim::adam>>(ranks, data, opt);
    REQUIRE(all_equal(local.back()));
    double largest = 0;
    for (std::size_t t = 0; t < mirrored[0][0].size(); ++t)
      for (std::size_t i = 0; i < mirrored[0][0][t].size(); ++i)
        largest = std::max(largest, std::abs(double(local[0][0][t][i]) - double(mirrored[0][0][t][i])));
    REQUIRE(largest > 1e-3);
  }
}

TEST_CASE("local_sgd<4> replicas drift between averaging points and agree on the mean right after each") {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  constexpr int period = 4, steps = 9;
  constexpr double lr = 0.1;
  const auto data = make_data(steps, ranks);
  const auto history =
      train<gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, period>>(ranks, data, gw::optim::sgd({.lr = lr}));

  // Serial float64 reference: every replica from rank 0's start, local steps, mean every H.
  std::vector<std::vector<std::vector<double>>> ref(ranks, initial<double>(0));  // [rank][tensor][element]
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k + 1);
    for (int r = 0; r < ranks; ++r) {
      const auto g = gradients(ref[r][0].data(), ref[r][1].data(), data[k][r]);
      for (std::size_t t = 0; t < g.size(); ++t)
        for (std::size_t i = 0; i < g[t].size(); ++i) ref[r][t][i] -= lr * g[t][i];
    }
    const bool averaged = (k + 1) % period == 0;
    if (averaged) {
      for (std::size_t t = 0; t < ref[0].size(); ++t)
        for (std::size_t i = 0; i < ref[0][t].size(); ++i) {
          double mean = 0;
          for (int r = 0; r < ranks; ++r) mean += ref[r][t][i] / ranks;
          for (int r = 0; r < ranks; ++r) ref[r][t][i] = mean;
        }
      REQUIRE(all_equal(history[k]));  // bit-identical right after averaging
      // Sharper than the trajectory: the mean of this step's local updates, from each
      // replica's own float parameters of the step before, computed in float64.
      for (std::size_t t = 0; t < ref[0].size(); ++t)
        for (std::size_t i = 0; i < ref[0][t].size(); ++i) {
          double mean = 0;
          for (int r = 0; r < ranks; ++r) {
            const auto& before = history[k - 1][r];
            const auto g = gradients(before[0].data(), before[1].data(), data[k][r]);
            mean += (double(before[t][i]) - lr * double(g[t][i])) / ranks;
          }
          REQUIRE(history[k][0][t][i] == Approx(mean).epsilon(1e-6).margin(1e-6));
        }
    } else {
      REQUIRE_FALSE(all_equal(history[k]));  // each replica stepped on its own data
    }
    for (int r = 0; r < ranks; ++r)
      for (std::size_t t = 0; t < ref[r].size(); ++t)
        for (std::size_t i = 0; i < ref[r][t].size(); ++i)
          REQUIRE(history[k][r][t][i] == Approx(ref[r][t][i]).epsilon(1e-4).margin(1e-5));
  }
}

TEST_CASE("averaging with a run-time period averages every `every` steps and refuses a period below 1") {
  SECTION("a period below 1 is refused with invalid_argument") {
    for (int bad : {0, -1, -7}) {
      CAPTURE(bad);
      try {
        gw::aggregation::averaging<> refused(bad);
        FAIL("averaging<>(" << bad << ") was accepted");
      } catch (const gw::error& e) {
        REQUIRE(e.kind() == gw::errc::invalid_argument);
        REQUIRE_THAT(e.what(), Catch::Contains("period must be >= 1") && Catch::Contains("got " + std::to_string(bad)));
      }
    }
  }
  SECTION("period 3 given at run time") {
    constexpr int ranks = 2, steps = 6;
    const auto data = make_data(steps, ranks);
    using strategy = gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::dynamic_period>;
    const auto history = train<strategy>(ranks, data, gw::optim::sgd({.lr = 0.1}), 3);
    for (int k = 0; k < steps; ++k) {
      CAPTURE(k + 1);
      REQUIRE(all_equal(history[k]) == ((k + 1) % 3 == 0));
    }
  }
}

TEST_CASE("local_sgd with one replica is one_device training") {
  constexpr int steps = 5;
  const auto data = make_data(steps, 1);
  const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9});
  const auto inproc = train<gw::local_sgd<gw::host_tensor<float>, gw::optim::momentum, 2>>(1, data, opt);

  gw::local_sgd<gw::host_tensor<float>, gw::optim::momentum, 2, gw::transport::local> alone(make_params(0), opt);
  gw::one_device<gw::host_tensor<float>, gw::optim::momentum> reference(make_params(0), opt);
  for (int k = 0; k < steps; ++k) {
    auto p = alone.parameters();
    alone.step(gradients(p[0].data(), p[1].data(), data[k][0]));
    auto q = reference.parameters();
    reference.step(gradients(q[0].data(), q[1].data(), data[k][0]));
    REQUIRE(snapshot(alone) == snapshot(reference));
    REQUIRE(inproc[k][0] == snapshot(reference));
  }
}

namespace {
using opaque_sgd = gradwire::test::plain_sgd;  // its state does not show its buffers (no for_each_buffer)
}  // namespace

TEST_CASE("local_sgd with average_optimizer_state averages the replicas' optimizer state at each averaging point") {
  using S = gw::local_sgd<gw::host_tensor<float>, gw::optim::momentum, 4>;
  constexpr int ranks = 3, steps = 6;
  const auto data = make_data(steps, ranks);
  const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9});
  // Each replica's velocity buffers, flattened, after step 4 (an averaging point) and step 6.
  auto velocities = [&](bool average_state) {
    std::vector<std::vector<std::vector<float>>> out(2, std::vector<std::vector<float>>(ranks));
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      S s(t, make_params(t.rank()), opt, S::aggregation_type().average_optimizer_state(average_state));
      for (int k = 0; k < steps; ++k) {
        auto p = s.parameters();
        s.step(gradients(p[0].data(), p[1].data(), data[k][t.rank()]));
        if (k == 3 || k == steps - 1)
          for (auto& st : s.optimizer_states())
            st.for_each_buffer([&](std::span<const float> b) {
              auto& v = out[k == 3 ? 0 : 1][t.rank()];
              v.insert(v.end(), b.begin(), b.end());
            });
      }
    });
    return out;
  };
  const auto local = velocities(false), averaged = velocities(true);
  // Without the option the replicas keep different velocities; with it they leave step 4
  // with the mean of the velocities they had (the steps before are the same in both runs).
  REQUIRE(local[0][0] != local[0][1]);
  for (int r = 1; r < ranks; ++r) REQUIRE(averaged[0][r] == averaged[0][0]);
  for (std::size_t i = 0; i < local[0][0].size(); ++i) {
    double mean = 0;
    for (int r = 0; r < ranks; ++r) mean += local[0][r][i] / double(ranks);
    REQUIRE(averaged[0][0][i] == Approx(mean).epsilon(1e-5).margin(1e-7));
  }
  // Between averaging points they drift again.
  REQUIRE(averaged[1][0] != averaged[1][1]);
  // An optimizer without visitable state is refused, not silently skipped: on one rank as
  // on two, so that a job tried alone does not fail only once it scales out.
  for (int n : {2, 1}) {
    CAPTURE(n);
    REQUIRE_THROWS_WITH(
        gw::transport::run_inproc(n,
                                  [&](gw::transport::inproc t) {
                                    gw::local_sgd<gw::host_tensor<float>, opaque_sgd, 1> s(
                                        t, make_params(t.rank()), opaque_sgd{},
                                        gw::aggregation::averaging<1>().average_optimizer_state());
                                    auto p = s.parameters();
                                    s.step(gradients(p[0].data(), p[1].data(), data[0][t.rank()]));
                                  }),
        Catch::Contains("for_each_buffer"));
  }
}
