// collective::compressed_all_reduce and aggregation::compressed_all_reduce<Codec> on inproc threads (bit-identical ranks, each codec's bound) and over asio_tcp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <gradwire/aggregation/compressed_all_reduce.hpp>
#include <gradwire/compress/codecs.hpp>
#include <gradwire/gradwire.hpp>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>
#if GRADWIRE_HAS_ASIO
#include "helpers/tcp_threads.hpp"
#endif
#include "helpers/errors.hpp"

namespace gw = gradwire;
namespace compress = gradwire::compress;

static_assert(gw::concepts::incremental_aggregation<gw::aggregation::compressed_all_reduce<compress::fp16>, float,
                                                    gw::concepts::detail::transport_archetype>);
static_assert(gw::concepts::incremental_aggregation<gw::aggregation::compressed_all_reduce<compress::powersgd>, double,
                                                    gw::concepts::detail::transport_archetype>);
static_assert(gw::concepts::incremental_aggregation<
              gw::aggregation::compressed_all_reduce<compress::error_feedback<compress::top_k>>, float,
              gw::concepts::detail::transport_archetype>);

namespace {

// inputs[rank][element], fresh random (normal, sigma 1).
std::vector<std::vector<float>> random_inputs(int ranks, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> x(static_cast<std::size_t>(ranks), std::vector<float>(n));
  for (auto& v : x)
    for (auto& e : v) e = normal(gen);
  return x;
}

// Runs `steps` compressed all-reduces on every rank (inputs from step-dependent seeds);
// out[step][rank] is what each rank ended with.
template <class Codec>
std::vector<std::vector<std::vector<float>>> reduce_on_threads(const Codec& codec, int ranks, std::size_t n, int steps,
                                                               std::uint64_t seed) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(steps),
                                                   std::vector<std::vector<float>>(static_cast<std::size_t>(ranks)));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    gw::collective::communicator comm(endpoint);
    const auto me = static_cast<std::size_t>(comm.rank());
    gw::collective::compressed_buffer<Codec, float> buffer(codec, n, comm.size());
    for (int s = 0; s < steps; ++s) {
      auto data = random_inputs(ranks, n, seed + static_cast<std::uint64_t>(s))[me];
      gw::collective::compressed_all_reduce(comm, codec, buffer, std::span<float>(data));
      out[static_cast<std::size_t>(s)][me] = data;
    }
  });
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& ranks) {
  for (const auto& r : ranks)
    if (r.size() != ranks[0].size() || std::memcmp(r.data(), ranks[0].data(), r.size() * sizeof(float)) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("compressed_all_reduce: every rank ends with the same bits, each codec within its bound of the float64 sum",
          "[compress]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const int ranks = GENERATE(1, 2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>(), 0, 1, 7, 1001);
  {
    {
      CAPTURE(ranks, n);
      const auto x = random_inputs(ranks, n, seed);
      std::vector<double> sum(n, 0.0), magnitude(n, 0.0);
      double largest_sum = 0;
      for (const auto& v : x)
        for (std::size_t i = 0; i < n; ++i) sum[i] += v[i], magnitude[i] += std::fabs(double(v[i]));
      for (double s : sum) largest_sum = std::max(largest_sum, std::fabs(s));
      double max_abs_total = 0;  // sum over ranks of each rank's max |x|: bounds every partial sum
      for (const auto& v : x) {
        double m = 0;
        for (float e : v) m = std::max(m, std::fabs(double(e)));
        max_abs_total += m;
      }
      SECTION("fp16: one rounding per ring hop, (N + 1) 2^-11 of the magnitudes summed") {
        const auto out = reduce_on_threads(compress::fp16(), ranks, n, 1, seed)[0];
        REQUIRE(same_bits(out));
        for (std::size_t i = 0; i < n; ++i)
          REQUIRE(std::fabs(double(out[0][i]) - sum[i]) <= (ranks + 1) * std::ldexp(magnitude[i], -11) + 1e-6);
      }
      SECTION("bf16 and int8 with error feedback: within their bounds") {
        const auto b = reduce_on_threads(compress::bf16(), ranks, n, 1, seed)[0];
        REQUIRE(same_bits(b));
        for (std::size_t i = 0; i < n; ++i)
          REQUIRE(std::fabs(double(b[0][i]) - sum[i]) <= (ranks + 1) * std::ldexp(magnitude[i], -8) + 1e-30);
        const auto q = reduce_on_threads(compress::error_feedback<compress::int8>(), ranks, n, 1, seed)[0];
        REQUIRE(same_bits(q));
        for (std::size_t i = 0; i < n; ++i)
          REQUIRE(std::fabs(double(q[0][i]) - sum[i]) <= (ranks + 1) * max_abs_total / 254 * (1 + 1e-6) + 1e-6);
      }
      SECTION("top-k: every rank's k largest, added in rank order") {
        const compress::top_k codec(0.1);
        const auto out = reduce_on_threads(codec, ranks, n, 1, seed)[0];
        REQUIRE(same_bits(out));
        std::vector<float> want(n, 0.0f);
        for (const auto& v : x) {  // each rank's kept set by a full sort, added in rank order
          std::vector<std::size_t> order(n);
          std::iota(order.begin(), order.end(), std::size_t{0});
          std::stable_sort(order.begin(), order.end(),
                           [&](std::size_t a, std::size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
          std::vector<float> kept(n, 0.0f);
          for (std::size_t j = 0; j < codec.k(n); ++j) kept[order[j]] = v[order[j]];
          for (std::size_t i = 0; i < n; ++i) want[i] += kept[i];
        }
        REQUIRE(out[0] == want);
      }
      SECTION("PowerSGD at full rank: the plain sum within float rounding; before the start step, exactly it") {
        const auto rows = compress::low_rank::matrix_shape::of(n, n).rows;
        const compress::powersgd codec({.rank = static_cast<int>(std::max<std::size_t>(rows, 1)), .start_step = 1});
        const auto out = reduce_on_threads(codec, ranks, n, 2, seed);
        for (const auto& step : out) REQUIRE(same_bits(step));
        const auto second = random_inputs(ranks, n, seed + 1);
        std::vector<double> sum2(n, 0.0);
        for (const auto& v : second)
          for (std::size_t i = 0; i < n; ++i) sum2[i] += v[i];
        double largest = 0;
        for (double s : sum2) largest = std::max(largest, std::fabs(s));
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(std::fabs(double(out[0][0][i]) - sum[i]) <= 1e-5 * (1 + largest_sum));  // plain step
          REQUIRE(std::fabs(double(out[1][0][i]) - sum2[i]) <= 1e-4 * (1 + largest));     // compressed step
        }
      }
    }
  }
}

namespace {

// Trains `steps` SGD steps of three tensors on `ranks` inproc threads with aggregation A;
// params[step][rank][tensor]. Gradients depend on step, rank and seed alone.
// The second is a matrix (13 x 77): PowerSGD under strategy<> reads it as one, the others go plain.
constexpr std::size_t tensor_sizes[] = {5, 1001, 17};
const gw::shape tensor_shapes[] = {gw::shape{5}, gw::shape{13, 77}, gw::shape{17}};
using params_t = std::vector<std::vector<float>>;

std::vector<std::vector<float>> gradients_of(int step, int rank, std::uint64_t seed) {
  std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(step * 101 + rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> g;
  for (std::size_t n : tensor_sizes) {
    g.emplace_back(n);
    for (auto& e : g.back()) e = normal(gen);
  }
  return g;
}

std::vector<gw::host_tensor<float>> initial_params(int rank) {
  std::vector<gw::host_tensor<float>> params;
  for (const gw::shape& t : tensor_shapes) {
    params.emplace_back(t);
    for (std::size_t i = 0; i < t.elements(); ++i) params.back().data()[i] = float(0.01 * double(i) + rank);
  }
  return params;
}

// One replica's steps; history[step][rank] is written by this rank's thread alone.
template <class Strategy>
void train_rank(Strategy& s, int me, int steps, std::uint64_t seed, std::vector<std::vector<params_t>>& history) {
  for (int k = 0; k < steps; ++k) {
    s.step(gradients_of(k, me, seed));
    params_t p;
    for (auto& t : s.parameters()) p.emplace_back(t.data(), t.data() + t.size());
    history[static_cast<std::size_t>(k)][static_cast<std::size_t>(me)] = p;
  }
}

template <class Aggregation>
std::vector<std::vector<params_t>> train(int ranks, int steps, std::uint64_t seed, Aggregation aggregation) {
  using strategy_t = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, Aggregation, gw::transport::inproc>;
  std::vector<std::vector<params_t>> history(static_cast<std::size_t>(steps),
                                             std::vector<params_t>(static_cast<std::size_t>(ranks)));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    const int me = endpoint.rank();
    strategy_t s(endpoint, initial_params(me), gw::optim::sgd({.lr = 0.1}), aggregation);
    train_rank(s, me, steps, seed, history);
  });
  return history;
}

#if GRADWIRE_HAS_ASIO
// The same run on asio_tcp ranks, one thread each; a rank's exception is rethrown after the join.
template <class Aggregation>
std::vector<std::vector<params_t>> train_tcp(int ranks, int steps, std::uint64_t seed, Aggregation aggregation) {
  using strategy_t = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, Aggregation, gw::transport::asio_tcp>;
  std::vector<std::vector<params_t>> history(static_cast<std::size_t>(steps),
                                             std::vector<params_t>(static_cast<std::size_t>(ranks)));
  gw::testing::run_tcp_threads(ranks, "test-compressed-all-reduce", [&](gw::transport::asio_tcp t) {
    const int r = t.rank();
    strategy_t s(std::move(t), initial_params(r), gw::optim::sgd({.lr = 0.1}), aggregation);
    train_rank(s, r, steps, seed, history);
  });
  return history;
}
#endif

// a and b hold the same bits, tensor by tensor (== would take -0 for 0 and fail on NaN).
bool same_bits(const params_t& a, const params_t& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t t = 0; t < a.size(); ++t)
    if (a[t].size() != b[t].size() || std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)) != 0) return false;
  return true;
}

bool all_equal(const std::vector<params_t>& replicas) {
  return std::all_of(replicas.begin(), replicas.end(), [&](const params_t& p) { return p == replicas[0]; });
}

}  // namespace

TEST_CASE("aggregation::compressed_all_reduce: bit-identical replicas, fp16 within its bound of float64 SGD, PowerSGD at "
          "full rank equals all_reduce within float rounding",
          "[compress]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  constexpr int steps = 4;
  constexpr std::size_t small_buckets = 600 * sizeof(float);  // several buckets, reduced in the background
  // float64 SGD on the mean gradient, from rank 0's start.
  std::vector<std::vector<double>> ref;
  for (std::size_t n : tensor_sizes) {
    ref.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) ref.back()[i] = double(float(0.01 * double(i)));
  }
  std::vector<std::vector<std::vector<double>>> ref_history;
  for (int k = 0; k < steps; ++k) {
    for (int r = 0; r < ranks; ++r) {
      const auto g = gradients_of(k, r, seed);
      for (std::size_t t = 0; t < g.size(); ++t)
        for (std::size_t i = 0; i < g[t].size(); ++i) ref[t][i] -= 0.1 * double(g[t][i]) / ranks;
    }
    ref_history.push_back(ref);
  }
  SECTION("fp16") {
    const auto h = train(ranks, steps, seed,
                         gw::aggregation::compressed_all_reduce<compress::fp16>(compress::fp16(), small_buckets));
    for (int k = 0; k < steps; ++k) {
      REQUIRE(all_equal(h[static_cast<std::size_t>(k)]));
      for (std::size_t t = 0; t < ref.size(); ++t)
        for (std::size_t i = 0; i < ref[t].size(); ++i)  // per step: lr (N + 1) 2^-11 of |g| <~ 4 sigma, plus float
          REQUIRE(std::fabs(double(h[static_cast<std::size_t>(k)][0][t][i]) - ref_history[static_cast<std::size_t>(k)][t][i]) <=
                  (k + 1) * (0.1 * (ranks + 1) * std::ldexp(5.0, -11) + 1e-6));
    }
    REQUIRE(h.back()[0][1][3] != float(0.03));  // it moved: the comparison is not vacuous
  }
  SECTION("PowerSGD at full rank, and top-k and int8 with error feedback: bit-identical") {
    const auto plain = train(ranks, steps, seed, gw::aggregation::all_reduce(small_buckets));
    const auto low = train(ranks, steps, seed,
                           gw::aggregation::compressed_all_reduce<compress::powersgd>(
                               compress::powersgd({.rank = 1000, .start_step = 1, .min_compression_rate = 0}),
                               small_buckets));
    for (int k = 0; k < steps; ++k) {
      REQUIRE(all_equal(low[static_cast<std::size_t>(k)]));
      for (std::size_t t = 0; t < ref.size(); ++t)
        for (std::size_t i = 0; i < ref[t].size(); ++i)
          REQUIRE(std::fabs(low[static_cast<std::size_t>(k)][0][t][i] - plain[static_cast<std::size_t>(k)][0][t][i]) <= 1e-5);
    }
    const auto sparse = train(ranks, steps, seed,
                              gw::aggregation::compressed_all_reduce<compress::error_feedback<compress::top_k>>(
                                  compress::error_feedback<compress::top_k>(compress::top_k(0.05)), small_buckets));
    const auto bytes = train(ranks, steps, seed,
                             gw::aggregation::compressed_all_reduce<compress::error_feedback<compress::int8>>(
                                 compress::error_feedback<compress::int8>(), small_buckets));
    for (int k = 0; k < steps; ++k) {
      REQUIRE(all_equal(sparse[static_cast<std::size_t>(k)]));
      REQUIRE(all_equal(bytes[static_cast<std::size_t>(k)]));
    }
  }
}

TEST_CASE("aggregation::compressed_all_reduce: strategy<> gives PowerSGD the tensors' shapes, an agent without them "
          "plans near-square, shapes that do not fit are refused",
          "[compress]") {
  using codec_t = compress::powersgd;
  using policy_t = gw::aggregation::compressed_all_reduce<codec_t>;
  const policy_t policy(codec_t({.rank = 2, .start_step = 0}));  // one bucket of 1023 elements
  gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, policy_t, gw::transport::inproc> s(
        endpoint, initial_params(endpoint.rank()), gw::optim::sgd({.lr = 0.1}), policy);
    const auto& plan = s.aggregation().codec_state(0).plan;
    REQUIRE(plan.n == 1023);
    REQUIRE(plan.matrices.size() == 1);
    CHECK(plan.matrices[0].count == 1001);
    CHECK((plan.matrices[0].shape.rows == 13 && plan.matrices[0].shape.cols == 77 && plan.matrices[0].shape.rank == 2));
    CHECK(plan.matrices[0].offset == s.aggregation().layout().offset(1));
    CHECK(plan.plain.size() == 2);
    CHECK(plan.p_size == 13 * 2 + 5 + 17);
  });
  gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
    gw::collective::communicator comm(endpoint);
    std::vector<std::vector<float>> storage;
    for (std::size_t n : tensor_sizes) storage.emplace_back(n, 1.0f);
    std::vector<std::span<float>> params(storage.begin(), storage.end());
    {  // by hand, no shapes: the bucket is one near-square matrix, 32 x 32 for 1023 elements
      policy_t::agent<float, gw::transport::inproc> agent(policy);
      agent.setup(comm, params);
      const auto& plan = agent.codec_state(0).plan;
      REQUIRE(plan.matrices.size() == 1);
      CHECK((plan.matrices[0].shape.rows == 32 && plan.matrices[0].shape.cols == 32 && plan.plain.empty()));
    }
    {  // a shape per tensor, but not the tensors' sizes
      policy_t::agent<float, gw::transport::inproc> agent(policy);
      const std::vector<gw::shape> wrong = {gw::shape{5}, gw::shape{13, 70}, gw::shape{17}};
      agent.use_shapes(wrong);
      const auto [kind, what] = gw::testing::error_of([&] { agent.setup(comm, params); });
      CHECK(kind == gw::errc::invalid_argument);
      CHECK_THAT(what, Catch::Contains("one shape per tensor, in the tensors' order"));
    }
  });
}

#if GRADWIRE_HAS_ASIO
TEST_CASE("compressed_all_reduce over asio_tcp: identical replicas, equal bit for bit to the inproc run", "[compress]") {
  // 3 asio_tcp ranks as threads of this process, then the same run on inproc threads.
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  constexpr int ranks = 3, steps = 4;
  constexpr std::size_t small_buckets = 600 * sizeof(float);  // several buckets, reduced in the background
  // The codec maths is deterministic and the ring runs in the same order on any transport:
  // TCP must give the bits that threads give.
  auto check = [&](auto aggregation) {
    const auto tcp = train_tcp(ranks, steps, seed, aggregation);
    const auto threads = train(ranks, steps, seed, aggregation);
    for (int k = 0; k < steps; ++k) {
      CAPTURE(k);
      const auto& at = tcp[static_cast<std::size_t>(k)];
      for (int r = 0; r < ranks; ++r) {
        CAPTURE(r);
        REQUIRE(same_bits(at[static_cast<std::size_t>(r)], at[0]));
        REQUIRE(same_bits(at[static_cast<std::size_t>(r)], threads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)]));
      }
    }
    params_t start;  // rank 0's, which setup broadcasts
    for (const auto& t : initial_params(0)) start.emplace_back(t.data(), t.data() + t.size());
    REQUIRE(tcp.back()[0] != start);  // it moved: the comparison is not vacuous
  };
  SECTION("fp16") {
    check(gw::aggregation::compressed_all_reduce<compress::fp16>(compress::fp16(), small_buckets));
  }
  SECTION("int8") {
    check(gw::aggregation::compressed_all_reduce<compress::int8>(compress::int8(), small_buckets));
  }
  SECTION("error_feedback<top_k>") {
    using codec = compress::error_feedback<compress::top_k>;
    check(gw::aggregation::compressed_all_reduce<codec>(codec(compress::top_k(0.05)), small_buckets));
  }
  SECTION("powersgd, plain for its first step, then rank 2") {
    check(gw::aggregation::compressed_all_reduce<compress::powersgd>(compress::powersgd({.rank = 2, .start_step = 1}),
                                                                      small_buckets));
  }
}
#endif
