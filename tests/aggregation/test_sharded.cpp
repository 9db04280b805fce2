// ZeRO-1 (aggregation::sharded): bit-identical to the ring all-reduce for SGD, momentum and Adam, on inproc threads and
// asio_tcp ranks; 1/N of the optimizer state per rank; any gradient order; checkpoints per rank restore exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <gradwire/asio.hpp>
#include <gradwire/gradwire.hpp>
#include <random>
#include <string>
#include <vector>

#include "helpers/errors.hpp"
#include "helpers/least_squares.hpp"
#include "helpers/tcp_threads.hpp"

namespace gw = gradwire;

static_assert(gw::concepts::aggregation<gw::aggregation::sharded, float, gw::transport::inproc>);
static_assert(gw::concepts::sharding_agent<gw::sharded<gw::host_tensor<float>, gw::optim::adam>::agent_type>);
static_assert(!gw::concepts::sharding_agent<gw::mirrored<gw::host_tensor<float>, gw::optim::adam>::agent_type>);

namespace {
constexpr std::size_t inputs = 7, outputs = 3, batch = 5;
const gw::testing::least_squares model{inputs, outputs, batch};
using gw::testing::batch_data;
using params_t = std::vector<std::vector<float>>;   // [tensor][element]
using history_t = std::vector<std::vector<params_t>>;  // [step][rank]

std::vector<std::vector<batch_data>> make_data(int steps, int ranks, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<batch_data>> data(static_cast<std::size_t>(steps));
  for (auto& step : data)
    for (int r = 0; r < ranks; ++r) step.push_back(model.random_batch(gen));
  return data;
}

// Rank r starts elsewhere: setup must broadcast rank 0's parameters.
std::vector<gw::host_tensor<float>> make_params(int rank) {
  std::vector<gw::host_tensor<float>> out;
  out.emplace_back(gw::shape{outputs * inputs});
  out.emplace_back(gw::shape{outputs});
  for (std::size_t i = 0; i < outputs * inputs; ++i) out[0].data()[i] = float(0.05 * std::sin(double(i) + 1) + rank);
  for (std::size_t i = 0; i < outputs; ++i) out[1].data()[i] = float(0.1 * double(i) - rank);
  return out;
}

template <class Strategy>
params_t snapshot(const Strategy& s) {
  params_t out;
  for (const auto& t : s.parameters()) out.emplace_back(t.data(), t.data() + t.size());
  return out;
}

// How a rank hands its gradients over: all at once (step(), last tensor first), or through
// the incremental step in an order of its own (shuffled per rank and step).
enum class handing { one_call, shuffled };

// `steps` steps of one rank; history[step][rank] gets its parameters after each.
template <class Strategy>
void train_rank(Strategy& s, int rank, const std::vector<std::vector<batch_data>>& data, history_t& history,
                handing how, int first_step = 0) {
  std::mt19937 order_gen(static_cast<std::uint32_t>(rank * 7919 + 1));
  for (std::size_t k = static_cast<std::size_t>(first_step); k < data.size(); ++k) {
    auto p = s.parameters();
    const auto g = model.gradients(p[0].data(), p[1].data(), data[k][static_cast<std::size_t>(rank)]);
    if (how == handing::one_call) {
      s.step(g);
    } else {
      std::vector<std::size_t> order{0, 1};
      std::shuffle(order.begin(), order.end(), order_gen);
      auto step = s.begin_step();
      for (std::size_t i : order) step.ready(i, std::span<const float>(g[i]));
      step.finish();
    }
    history[k][static_cast<std::size_t>(rank)] = snapshot(s);
  }
}

template <class Aggregation, class Optimizer>
history_t train_inproc(int ranks, const std::vector<std::vector<batch_data>>& data, const Optimizer& optimizer,
                       Aggregation aggregation, handing how = handing::one_call,
                       std::vector<std::size_t>* state_bytes = nullptr) {
  history_t history(data.size(), std::vector<params_t>(static_cast<std::size_t>(ranks)));
  if (state_bytes) state_bytes->assign(static_cast<std::size_t>(ranks), 0);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::strategy<gw::host_tensor<float>, Optimizer, Aggregation, gw::transport::inproc> s(
        t, make_params(t.rank()), optimizer, aggregation);
    train_rank(s, t.rank(), data, history, how);
    if (state_bytes) (*state_bytes)[static_cast<std::size_t>(t.rank())] = s.optimizer_state_bytes();
  });
  return history;
}

// The same on asio_tcp ranks, one thread each.
template <class Aggregation, class Optimizer>
history_t train_tcp(int ranks, const std::vector<std::vector<batch_data>>& data, const Optimizer& optimizer,
                    Aggregation aggregation) {
  history_t history(data.size(), std::vector<params_t>(static_cast<std::size_t>(ranks)));
  gw::testing::run_tcp_threads(ranks, "test-sharded", [&](gw::transport::asio_tcp t) {
    const int r = t.rank();
    gw::strategy<gw::host_tensor<float>, Optimizer, Aggregation, gw::transport::asio_tcp> s(
        std::move(t), make_params(r), optimizer, aggregation);
    train_rank(s, r, data, history, handing::one_call);
  });
  return history;
}

using ring_all_reduce = gw::aggregation::all_reduce_with<gw::collective::ring>;

// Every rank of `a` equals every rank of `b` after every step, bit for bit.
void require_bit_identical(const history_t& a, const history_t& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k)
    for (std::size_t r = 0; r < a[k].size(); ++r) {
      CAPTURE(k, r);
      REQUIRE(a[k][r] == b[k][0]);
      REQUIRE(b[k][r] == b[k][0]);
    }
}

// Plain SGD on the mean gradient, serially in double: the reference computed another way.
params_t sgd_reference(int ranks, const std::vector<std::vector<batch_data>>& data, double lr) {
  const auto start = make_params(0);
  std::vector<double> w(start[0].data(), start[0].data() + start[0].size());
  std::vector<double> b(start[1].data(), start[1].data() + start[1].size());
  for (const auto& step : data) {
    std::vector<double> gw_sum(w.size(), 0.0), gb_sum(b.size(), 0.0);
    for (int r = 0; r < ranks; ++r) {
      const auto g = model.gradients(w.data(), b.data(), step[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < w.size(); ++i) gw_sum[i] += g[0][i];
      for (std::size_t i = 0; i < b.size(); ++i) gb_sum[i] += g[1][i];
    }
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * gw_sum[i] / ranks;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] -= lr * gb_sum[i] / ranks;
  }
  return {std::vector<float>(w.begin(), w.end()), std::vector<float>(b.begin(), b.end())};
}

const std::uint32_t seed = std::random_device{}();
}  // namespace

TEST_CASE("sharded equals the ring all-reduce bit for bit with SGD, momentum and Adam, in one bucket and in many") {
  const int ranks = GENERATE(2, 3, 4, 5);
  // 16 bytes: every tensor its own bucket (the 3-element bias has fewer elements than 5 ranks).
  const std::size_t bucket_bytes = GENERATE(std::size_t{16}, gw::collective::default_bucket_bytes);
  CAPTURE(ranks, bucket_bytes, seed);
  const auto data = make_data(6, ranks, seed);
  SECTION("SGD, and both equal a float64 serial reference") {
    const gw::optim::sgd sgd({.lr = 0.1, .weight_decay = 0.01});
    const auto zero = train_inproc(ranks, data, sgd, gw::aggregation::sharded(bucket_bytes));
    require_bit_identical(zero, train_inproc(ranks, data, sgd, ring_all_reduce(bucket_bytes)));
    const auto plain = gw::optim::sgd({.lr = 0.1});
    const auto reference = sgd_reference(ranks, data, 0.1);
    const auto got = train_inproc(ranks, data, plain, gw::aggregation::sharded(bucket_bytes)).back()[0];
    for (std::size_t t = 0; t < reference.size(); ++t)
      for (std::size_t i = 0; i < reference[t].size(); ++i)
        REQUIRE(got[t][i] == Approx(reference[t][i]).epsilon(1e-5).margin(1e-6));
    REQUIRE(got[1][0] != make_params(0)[1].data()[0]);  // it trained: the comparison is not vacuous
  }
  SECTION("Nesterov momentum with weight decay") {
    const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01});
    require_bit_identical(train_inproc(ranks, data, opt, gw::aggregation::sharded(bucket_bytes)),
                          train_inproc(ranks, data, opt, ring_all_reduce(bucket_bytes)));
  }
  SECTION("AdamW") {
    const gw::optim::adamw opt({.lr = 0.01, .weight_decay = 0.01});
    require_bit_identical(train_inproc(ranks, data, opt, gw::aggregation::sharded(bucket_bytes)),
                          train_inproc(ranks, data, opt, ring_all_reduce(bucket_bytes)));
  }
}

TEST_CASE("sharded holds 1/N of the optimizer state on each rank, and together all of it") {
  const int ranks = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(ranks, seed);
  const auto data = make_data(2, ranks, seed);
  const gw::optim::adam adam({.lr = 0.01});
  std::vector<std::size_t> zero_bytes, full_bytes;
  train_inproc(ranks, data, adam, gw::aggregation::sharded(), handing::one_call, &zero_bytes);
  train_inproc(ranks, data, adam, gw::aggregation::all_reduce(), handing::one_call, &full_bytes);
  const std::size_t whole = 2 * (outputs * inputs + outputs) * sizeof(float);  // Adam: two moments
  std::size_t sum = 0;
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(full_bytes[static_cast<std::size_t>(r)] == whole);
    // One bucket, chunked as the ring chunks it: ceil or floor of 1/N of the elements.
    const std::size_t elements = outputs * inputs + outputs, n = static_cast<std::size_t>(ranks);
    const std::size_t mine = elements / n + (static_cast<std::size_t>(r) < elements % n ? 1 : 0);
    REQUIRE(zero_bytes[static_cast<std::size_t>(r)] == 2 * mine * sizeof(float));
    sum += zero_bytes[static_cast<std::size_t>(r)];
  }
  REQUIRE(sum == whole);
}

TEST_CASE("sharded: gradients handed over in any order per rank give the same bits") {
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks, seed);
  const auto data = make_data(5, ranks, seed);
  const gw::optim::adam adam({.lr = 0.01});
  // Small buckets: the order decides which bucket goes out when, never what it sums.
  const auto shuffled = train_inproc(ranks, data, adam, gw::aggregation::sharded(16), handing::shuffled);
  require_bit_identical(shuffled, train_inproc(ranks, data, adam, gw::aggregation::sharded(16)));
}

TEST_CASE("sharded over asio_tcp equals the ring all-reduce bit for bit") {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks, seed);
  const auto data = make_data(4, ranks, seed);
  const gw::optim::adam adam({.lr = 0.01});
  require_bit_identical(train_tcp(ranks, data, adam, gw::aggregation::sharded(16)),
                        train_inproc(ranks, data, adam, ring_all_reduce(16)));
}

TEST_CASE("sharded: each rank saves its shard, a restore with the same N goes on exactly, another N is refused") {
  constexpr int ranks = 3, steps = 6, saved_at = 3;
  CAPTURE(seed);
  const auto data = make_data(steps, ranks, seed);
  const gw::optim::adam adam({.lr = 0.01});
  const auto dir = std::filesystem::temp_directory_path() / ("gradwire-sharded-" + std::to_string(seed));
  std::filesystem::create_directories(dir);
  auto file = [&](int r) { return dir / ("rank" + std::to_string(r) + ".ckpt"); };
  using zero = gw::sharded<gw::host_tensor<float>, gw::optim::adam>;
  const auto straight = train_inproc(ranks, data, adam, gw::aggregation::sharded(16));
  history_t resumed(steps, std::vector<params_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const auto first = std::vector<std::vector<batch_data>>(data.begin(), data.begin() + saved_at);
    history_t ignored(saved_at, std::vector<params_t>(ranks));
    zero s(t, make_params(t.rank()), adam, gw::aggregation::sharded(16));
    train_rank(s, t.rank(), first, ignored, handing::one_call);
    gw::save_checkpoint(file(t.rank()), s, saved_at);
  });
  std::vector<std::uint64_t> loaded_step(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    zero s(t, make_params(t.rank() + 10), adam, gw::aggregation::sharded(16));  // elsewhere until loaded
    loaded_step[static_cast<std::size_t>(t.rank())] = gw::load_checkpoint(file(t.rank()), s);
    train_rank(s, t.rank(), data, resumed, handing::one_call, saved_at);
  });
  for (std::size_t r = 0; r < ranks; ++r) REQUIRE(loaded_step[r] == saved_at);
  for (std::size_t k = saved_at; k < steps; ++k)
    for (std::size_t r = 0; r < ranks; ++r) REQUIRE(resumed[k][r] == straight[k][0]);
  // Rank 1 of a 2-rank job owns other slices than rank 0 of the 3-rank job: its file does not fit.
  gw::testing::outcome refused;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    zero s(t, make_params(0), adam, gw::aggregation::sharded(16));
    if (t.rank() == 1) refused = gw::testing::outcome_of([&] { gw::load_checkpoint(file(0), s); });
  });
  std::filesystem::remove_all(dir);
  REQUIRE(refused.kind == gw::errc::config);
  REQUIRE_THAT(refused.what, Catch::Contains("rank0.ckpt"));
}

TEST_CASE("sharded refuses GRADWIRE_MIN_REPLICAS (it cannot shrink)") {
  ::setenv("GRADWIRE_MIN_REPLICAS", "1", 1);
  struct unset {
    ~unset() { ::unsetenv("GRADWIRE_MIN_REPLICAS"); }
  } restore;
  std::vector<gw::testing::outcome> outcomes(2);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    outcomes[static_cast<std::size_t>(t.rank())] =
        gw::testing::outcome_of([&] { gw::sharded<gw::host_tensor<float>, gw::optim::sgd> s(t, make_params(0)); });
  });
  for (const auto& o : outcomes) {
    REQUIRE(o.kind == gw::errc::config);
    REQUIRE_THAT(o.what, Catch::Contains("aggregation::sharded"));
  }
}
