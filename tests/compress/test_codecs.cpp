// The gradient codecs (gradwire/compress/): each against a float64 reference of its own definition, computed another way.
#include <catch2/catch.hpp>

#include "helpers/errors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gradwire/compress/codecs.hpp>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace gw = gradwire;
namespace compress = gradwire::compress;

static_assert(gw::concepts::compressor<compress::fp16, float> && gw::concepts::compressor<compress::powersgd, double>);
static_assert(compress::fp16::kind == gw::concepts::compression_kind::linear);
static_assert(compress::top_k::kind == gw::concepts::compression_kind::gathered);
static_assert(compress::error_feedback<compress::top_k>::kind == gw::concepts::compression_kind::gathered);
static_assert(compress::powersgd::kind == gw::concepts::compression_kind::low_rank);

namespace {

const std::size_t sizes[] = {0, 1, 2, 7, 1001, (1u << 18) + 3};

// Values over many binades, both signs, a few exact zeros.
template <class V>
std::vector<V> spread(std::size_t n, std::mt19937_64& gen, int lowest_exponent, int highest_exponent) {
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(lowest_exponent, highest_exponent), coin(0, 1), rare(0, 99);
  std::vector<V> x(n);
  for (auto& v : x) v = rare(gen) == 0 ? V(0) : static_cast<V>((coin(gen) ? -1 : 1) * std::ldexp(mantissa(gen), exponent(gen)));
  return x;
}

template <class V>
std::vector<V> normal(std::size_t n, std::mt19937_64& gen, double sigma = 1.0) {
  std::normal_distribution<double> d(0.0, sigma);
  std::vector<V> x(n);
  for (auto& v : x) v = static_cast<V>(d(gen));
  return x;
}

template <class Codec, class V>
std::vector<std::byte> encode(const Codec& codec, typename Codec::template state<V>& s, const std::vector<V>& x) {
  std::vector<std::byte> payload(codec.template encoded_bytes<V>(x.size()));
  codec.encode(s, std::span<const V>(x), std::span<std::byte>(payload));
  return payload;
}

template <class Codec, class V>
std::vector<V> round_trip(const Codec& codec, const std::vector<V>& x) {
  auto s = codec.template init<V>(x.size());
  const auto payload = encode(codec, s, x);
  std::vector<V> out(x.size(), V(-7));  // decode overwrites every element
  codec.decode(std::span<const std::byte>(payload), std::span<V>(out));
  return out;
}

// Nearest value of a binary format with `mantissa_bits` stored and normal exponents down to
// `min_exponent` (subnormals below), ties to even, infinite from `overflow` up: by frexp,
// ldexp and nearbyint in double, not by bits.
double reference_round(double x, int mantissa_bits, int min_exponent, double overflow) {
  if (std::isnan(x) || std::isinf(x)) return x;
  if (std::fabs(x) >= overflow) return std::copysign(std::numeric_limits<double>::infinity(), x);
  if (x == 0) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, min_exponent);
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  return std::nearbyint(x / ulp) * ulp;  // x / ulp exact (a power of two); nearbyint ties to even
}
double reference_fp16(double x) { return reference_round(x, 10, -14, 65520.0); }
double reference_bf16(double x) { return reference_round(x, 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127)); }

template <class V, class Codec, class Reference>
void check_cast(const Codec& codec, Reference reference, double relative_bound, double smallest_normal, double largest,
                std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (std::size_t n : sizes) {
    CAPTURE(n);
    auto x = spread<V>(n, gen, -40, 20);
    // Ties and near-ties where double rounding through float would go wrong, the edges of the range.
    const double edges[] = {1 + std::ldexp(1.0, -11), 1 + 3 * std::ldexp(1.0, -11), 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                            1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8), 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),
                            65504, 65519.99, 65520, -65520, std::ldexp(1.0, -25), std::ldexp(1.0, -24) * 1.5,
                            std::ldexp(1.0, -134), std::ldexp(1.0, -133) * 1.5, -0.0, 3.0e38,
                            std::numeric_limits<double>::infinity()};
    for (std::size_t i = 0; i < std::min(x.size(), std::size(edges)); ++i) x[i] = static_cast<V>(edges[i]);
    const auto y = round_trip(codec, x);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = static_cast<double>(static_cast<float>(reference(static_cast<double>(x[i]))));
      if (static_cast<double>(y[i]) != want) {
        INFO("element " << i << " = " << static_cast<double>(x[i]) << " decoded " << static_cast<double>(y[i])
                        << ", the reference rounds to " << want);
        CHECK(static_cast<double>(y[i]) == want);
      }
      const double a = std::fabs(static_cast<double>(x[i]));
      if (a >= smallest_normal && a <= largest && std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])) > relative_bound * a) {
        INFO("element " << i << " = " << static_cast<double>(x[i]) << " decoded " << static_cast<double>(y[i]));
        CHECK(std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])) <= relative_bound * a);
      }
    }
    // decode_add adds the same values.
    auto s = codec.template init<V>(n);
    const auto payload = encode(codec, s, x);
    std::vector<V> base = normal<V>(n, gen), sum = base;
    codec.decode_add(std::span<const std::byte>(payload), std::span<V>(sum));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(std::bit_cast<std::uint64_t>(static_cast<double>(sum[i])) ==
                                                std::bit_cast<std::uint64_t>(static_cast<double>(base[i] + y[i])));
  }
  // NaN stays NaN.
  const std::vector<V> nan{std::numeric_limits<V>::quiet_NaN()};
  CHECK(std::isnan(round_trip(codec, nan)[0]));
}

}  // namespace

TEST_CASE("compress::fp16 rounds to the nearest half, ties to even, within 2^-11", "[compress]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  check_cast<float>(compress::fp16(), reference_fp16, std::ldexp(1.0, -11), std::ldexp(1.0, -14), 65504.0, seed);
  check_cast<double>(compress::fp16(), reference_fp16, std::ldexp(1.0, -11), std::ldexp(1.0, -14), 65504.0, seed);
  CHECK(compress::fp16().encoded_bytes<float>(1001) == 2002);
}

TEST_CASE("compress::bf16 rounds to the nearest bfloat16, ties to even, within 2^-8", "[compress]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
  check_cast<float>(compress::bf16(), reference_bf16, std::ldexp(1.0, -8), std::ldexp(1.0, -126), largest, seed);
  check_cast<double>(compress::bf16(), reference_bf16, std::ldexp(1.0, -8), std::ldexp(1.0, -126), largest, seed);
}

TEMPLATE_TEST_CASE("compress::int8: scale max|x|/127, each element within scale/2", "[compress]", float, double) {
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  const compress::int8 codec;
  for (std::size_t n : sizes) {
    CAPTURE(n);
    auto x = normal<V>(n, gen, 3.0);
    if (n > 2) x[n / 2] = V(40);  // one large element: the small ones lose bits, within the bound
    auto s = codec.init<V>(n);
    const auto payload = encode(codec, s, x);
    REQUIRE(payload.size() == 4 + n);
    double largest = 0;
    for (V v : x) largest = std::max(largest, std::fabs(static_cast<double>(v)));
    const auto scale = static_cast<float>(largest / 127);
    float stored;
    std::memcpy(&stored, payload.data(), sizeof stored);
    REQUIRE(stored == scale);
    std::vector<V> y(n);
    codec.decode(std::span<const std::byte>(payload), std::span<V>(y));
    for (std::size_t i = 0; i < n; ++i) {
      const double q = scale > 0 ? std::nearbyint(static_cast<double>(x[i]) / static_cast<double>(scale)) : 0.0;
      REQUIRE(std::fabs(q) <= 127);
      REQUIRE(y[i] == static_cast<V>(q * static_cast<double>(scale)));
      const double error = std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i]));
      REQUIRE(error <= static_cast<double>(scale) / 2 + std::fabs(static_cast<double>(y[i])) * std::numeric_limits<V>::epsilon());
    }
  }
  // All zeros: scale 0, zeros back.
  const std::vector<V> zeros(5, V(0));
  CHECK(round_trip(codec, zeros) == zeros);
}

TEMPLATE_TEST_CASE("compress::top_k keeps exactly the k largest magnitudes and zeros the rest", "[compress]", float, double) {
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  for (double fraction : {0.001, 0.01, 0.3, 1.0}) {
    const compress::top_k codec(fraction);
    for (std::size_t n : sizes) {
      CAPTURE(fraction, n);
      auto x = normal<V>(n, gen);
      // Ties: a third of the elements share a few magnitudes, so the lower index must win.
      std::uniform_int_distribution<int> pick(0, 2), level(1, 3);
      for (auto& v : x)
        if (pick(gen) == 0) v = static_cast<V>((pick(gen) == 0 ? -1 : 1) * level(gen));
      const std::size_t k = n == 0 ? 0 : std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(fraction * double(n))));
      REQUIRE(codec.k(n) == std::min(k, n));
      REQUIRE(codec.encoded_bytes<V>(n) == codec.k(n) * (4 + sizeof(V)));
      // Reference: every index sorted by (magnitude descending, index ascending).
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return std::fabs(static_cast<double>(x[a])) > std::fabs(static_cast<double>(x[b]));
      });
      std::vector<char> kept(n, 0);
      for (std::size_t j = 0; j < codec.k(n); ++j) kept[order[j]] = 1;
      const auto y = round_trip(codec, x);
      std::size_t nonzero_kept = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (kept[i]) {
          REQUIRE(y[i] == x[i]);
          ++nonzero_kept;
        } else {
          REQUIRE(y[i] == V(0));
        }
      }
      REQUIRE(nonzero_kept == codec.k(n));
    }
  }
}

TEST_CASE("compress::error_feedback carries exactly the residual x + r - decode(encode(x + r))", "[compress]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  auto run = [&](const auto& codec, auto zero) {
    using V = decltype(zero);
    using Codec = std::remove_cvref_t<decltype(codec)>;
    const compress::error_feedback<Codec> feedback(codec);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{(1u << 16) + 5}}) {
      CAPTURE(n, Codec::name);
      auto s = feedback.template init<V>(n);
      auto inner = codec.template init<V>(n);
      std::vector<V> sent_sum(n, V(0));
      std::vector<double> input_sum(n, 0.0);
      for (int step = 0; step < 4; ++step) {
        CAPTURE(step);
        const auto x = normal<V>(n, gen, 1.0 + step);
        const std::vector<V> r(s.residual.data(), s.residual.data() + n);
        const auto payload = encode(feedback, s, x);
        // The payload is the codec's encoding of x + r, byte for byte.
        std::vector<V> corrected(n);
        for (std::size_t i = 0; i < n; ++i) corrected[i] = x[i] + r[i];
        REQUIRE(payload == encode(codec, inner, corrected));
        std::vector<V> decoded(n);
        feedback.decode(std::span<const std::byte>(payload), std::span<V>(decoded));
        for (std::size_t i = 0; i < n; ++i) {
          const V want = (x[i] + r[i]) - decoded[i];
          if (std::memcmp(&want, s.residual.data() + i, sizeof(V)) != 0) {
            INFO("element " << i);
            REQUIRE(s.residual.data()[i] == want);
          }
          sent_sum[i] += decoded[i];
          input_sum[i] += static_cast<double>(x[i]);
        }
      }
      // Nothing lost, only delayed: what was sent plus what is held is what came in.
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(std::fabs(static_cast<double>(sent_sum[i]) + static_cast<double>(s.residual.data()[i]) - input_sum[i]) <=
                1e-4 * (1 + std::fabs(input_sum[i])));
    }
  };
  run(compress::fp16(), float{});
  run(compress::bf16(), double{});
  run(compress::int8(), float{});
  run(compress::int8(), double{});
  run(compress::top_k(0.05), float{});
  run(compress::top_k(0.3), double{});
}

namespace {

// PowerSGD's algorithm in float64, serially and with no code in common with the codec: M
// row-major rows x cols from the shape rule, P and Q as [row][column] arrays, classical
// Gram-Schmidt. ranks[r] is rank r's state.
struct reference_powersgd {
  std::size_t n, rows, cols, rank;
  std::vector<std::vector<double>> q;                     // [cols][rank], the warm start
  std::vector<std::vector<double>> residual;              // [rank of the job][n]

  std::vector<double> matrix(const std::vector<double>& flat) const {
    std::vector<double> m(rows * cols, 0.0);
    std::copy(flat.begin(), flat.end(), m.begin());
    return m;
  }
  // One step over every rank's gradient: the approximation of their sum.
  std::vector<double> step(const std::vector<std::vector<double>>& grads) {
    const std::size_t job = grads.size();
    std::vector<std::vector<double>> ms;
    std::vector<std::vector<double>> p(rows, std::vector<double>(rank, 0.0));
    for (std::size_t w = 0; w < job; ++w) {
      std::vector<double> g = grads[w];
      for (std::size_t i = 0; i < n; ++i) g[i] += residual[w][i];
      ms.push_back(matrix(g));
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t c = 0; c < rank; ++c)
          for (std::size_t j = 0; j < cols; ++j) p[i][c] += ms[w][i * cols + j] * q[j][c];
    }
    for (std::size_t c = 0; c < rank; ++c) {  // classical Gram-Schmidt
      std::vector<double> dots(c, 0.0);
      for (std::size_t b = 0; b < c; ++b)
        for (std::size_t i = 0; i < rows; ++i) dots[b] += p[i][c] * p[i][b];
      for (std::size_t b = 0; b < c; ++b)
        for (std::size_t i = 0; i < rows; ++i) p[i][c] -= dots[b] * p[i][b];
      double norm = 0;
      for (std::size_t i = 0; i < rows; ++i) norm += p[i][c] * p[i][c];
      for (std::size_t i = 0; i < rows; ++i) p[i][c] /= std::sqrt(norm);
    }
    std::vector<std::vector<double>> sum_q(cols, std::vector<double>(rank, 0.0));
    for (std::size_t w = 0; w < job; ++w) {
      std::vector<std::vector<double>> qw(cols, std::vector<double>(rank, 0.0));
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t c = 0; c < rank; ++c)
          for (std::size_t i = 0; i < rows; ++i) qw[j][c] += ms[w][i * cols + j] * p[i][c];
      for (std::size_t k = 0; k < n; ++k) {
        double approx = 0;
        for (std::size_t c = 0; c < rank; ++c) approx += p[k / cols][c] * qw[k % cols][c];
        residual[w][k] = ms[w][k] - approx;
      }
      for (std::size_t j = 0; j < cols; ++j)
        for (std::size_t c = 0; c < rank; ++c) sum_q[j][c] += qw[j][c];
    }
    q = sum_q;
    std::vector<double> out(n, 0.0);
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t c = 0; c < rank; ++c) out[k] += p[k / cols][c] * q[k % cols][c];
    return out;
  }
};

// PowerSGD's all-reduce of a factor, serially: the sum over the ranks' parts in rank order,
// the same bits handed to every rank.
template <class V>
void sum_in_rank_order(std::vector<std::span<V>> parts) {
  std::vector<V> sum(parts[0].size(), V(0));
  for (const auto& part : parts)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  for (auto& part : parts) std::copy(sum.begin(), sum.end(), part.begin());
}

// The float64 algorithm for matrix k of a state's plan, from the codec's first Q for it
// (which every rank shares); init<V>(n) plans one near-square matrix, k = 0.
template <class V>
reference_powersgd reference_from(const typename compress::powersgd::state<V>& s, std::size_t job, std::size_t k = 0) {
  const auto& a = s.plan.matrices[k];
  reference_powersgd ref{a.count, a.shape.rows, a.shape.cols, a.shape.rank, {}, {}};
  ref.q.assign(ref.cols, std::vector<double>(ref.rank));
  for (std::size_t j = 0; j < ref.cols; ++j)
    for (std::size_t c = 0; c < ref.rank; ++c)
      ref.q[j][c] = static_cast<double>(s.q.data()[a.q_offset + c * ref.cols + j]);
  ref.residual.assign(job, std::vector<double>(a.count, 0.0));
  return ref;
}

double largest_magnitude(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

TEST_CASE("compress::powersgd's shape rule: near-square, rows <= cols, padding under one row", "[compress]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}, std::size_t{17},
                        std::size_t{1000}, std::size_t{1001}, std::size_t{6553600}}) {
    CAPTURE(n);
    const auto s = compress::low_rank::matrix_shape::of(n, 3);
    REQUIRE(s.cols * s.cols >= n);
    REQUIRE((s.cols - 1) * (s.cols - 1) < n);
    REQUIRE(s.rows * s.cols >= n);
    REQUIRE((s.rows - 1) * s.cols < n);
    REQUIRE(s.rows <= s.cols);
    REQUIRE(s.rank == std::min<std::size_t>(3, s.rows));
  }
  CHECK(compress::low_rank::matrix_shape::of(0, 3).rows == 0);
  CHECK(compress::powersgd({.rank = 2}).encoded_bytes<float>(1000) == (32 + 32) * 2 * 4);
}

TEMPLATE_TEST_CASE("compress::powersgd at full rank reconstructs M within float rounding", "[compress]", float, double) {
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{101}, std::size_t{1001},
                        std::size_t{4099}}) {
    CAPTURE(n);
    const auto full = compress::low_rank::matrix_shape::of(n, n).rows;
    const compress::powersgd codec({.rank = static_cast<int>(std::max<std::size_t>(full, 1)), .start_step = 0});
    auto s = codec.init<V>(n);
    REQUIRE(s.plan.matrices.front().shape.rank == full);
    for (int step = 0; step < 4; ++step) {  // warm-started steps too
      auto x = normal<V>(n, gen);
      // The last step's rows graded over six decades: P = M Q is then ill-conditioned, and
      // one Gram-Schmidt pass in float leaves P far from orthonormal.
      if (step == 3)
        for (std::size_t k = 0; k < n; ++k)
          x[k] *= static_cast<V>(std::pow(10.0, -6.0 * double(k / s.plan.matrices.front().shape.cols) / double(full)));
      // M is x plus the residual carried in (the last step's rounding, error feedback's): a
      // tolerance from x alone fails when x is much smaller than the last step's (n = 1).
      std::vector<V> m(n);
      for (std::size_t i = 0; i < n; ++i) m[i] = x[i] + s.residual.data()[i];
      const auto payload = encode(codec, s, x);
      std::vector<V> y(n);
      codec.decode(std::span<const std::byte>(payload), std::span<V>(y));
      double largest = 0;
      for (V v : m) largest = std::max(largest, std::fabs(static_cast<double>(v)));
      const double tolerance = 64 * std::sqrt(static_cast<double>(full) + 1) * std::numeric_limits<V>::epsilon() * largest;
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(step, i);
        REQUIRE(std::fabs(static_cast<double>(y[i]) - static_cast<double>(m[i])) <= tolerance);
        // Nothing left over: the residual is rounding.
        REQUIRE(std::fabs(static_cast<double>(s.residual.data()[i])) <= tolerance);
      }
    }
  }
}

TEMPLATE_TEST_CASE("compress::powersgd below full rank matches a float64 reference, single encodes and the two rounds",
                   "[compress]", float, double) {
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  const double tolerance = std::is_same_v<V, float> ? 2e-3 : 1e-9;  // relative to the output's largest element
  for (std::size_t n : {std::size_t{7}, std::size_t{101}, std::size_t{1001}}) {
    for (int rank : {1, 2}) {
      CAPTURE(n, rank);
      // Low-rank gradients plus noise, as real ones are: the power iteration has a subspace to find.
      const auto shape = compress::low_rank::matrix_shape::of(n, static_cast<std::size_t>(rank));
      const auto left = normal<double>(shape.rows, gen), right = normal<double>(shape.cols, gen);
      auto gradient = [&](double noise) {
        auto x = normal<V>(n, gen, noise);
        for (std::size_t k = 0; k < n; ++k) x[k] += static_cast<V>(3 * left[k / shape.cols] * right[k % shape.cols]);
        return x;
      };
      // Not SECTIONs: a SECTION in a loop runs in its first iteration alone (Catch2 tracks it by
      // name and line), so n 101 and 1001 and rank 2 were never run.
      {  // single encodes (a parameter-server push)
        const compress::powersgd codec({.rank = rank, .start_step = 0});
        auto s = codec.init<V>(n);
        auto ref = reference_from<V>(s, 1);
        for (int step = 0; step < 4; ++step) {
          CAPTURE(step);
          const auto x = gradient(0.1);
          const auto payload = encode(codec, s, x);
          std::vector<V> y(n);
          codec.decode(std::span<const std::byte>(payload), std::span<V>(y));
          const auto want = ref.step({std::vector<double>(x.begin(), x.end())});
          const double scale = largest_magnitude(want);
          for (std::size_t i = 0; i < n; ++i) {
            CAPTURE(i);
            REQUIRE(std::fabs(static_cast<double>(y[i]) - want[i]) <= tolerance * scale);
            REQUIRE(std::fabs(static_cast<double>(s.residual.data()[i]) - ref.residual[0][i]) <= tolerance * scale);
          }
        }
      }
      {  // the rounds of three ranks, sums in rank order, plain before the start step
        constexpr int job = 3;
        const compress::powersgd codec({.rank = rank, .start_step = 2});
        std::vector<typename compress::powersgd::state<V>> states;
        for (int w = 0; w < job; ++w) states.push_back(codec.init<V>(n));
        auto ref = reference_from<V>(states[0], job);
        for (int step = 0; step < 5; ++step) {
          CAPTURE(step);
          std::vector<std::vector<V>> x;
          for (int w = 0; w < job; ++w) x.push_back(gradient(0.1));
          std::vector<std::span<V>> first, second;
          for (int w = 0; w < job; ++w) first.push_back(codec.low_rank_begin(states[w], std::span<const V>(x[w])));
          sum_in_rank_order(first);
          for (int w = 0; w < job; ++w) second.push_back(codec.low_rank_middle(states[w]));
          REQUIRE(second[0].empty() == (step < 2));
          if (!second[0].empty()) sum_in_rank_order(second);
          std::vector<std::vector<V>> out(job, std::vector<V>(n));
          for (int w = 0; w < job; ++w) codec.low_rank_end(states[w], std::span<V>(out[w]));
          for (int w = 1; w < job; ++w) REQUIRE(std::memcmp(out[w].data(), out[0].data(), n * sizeof(V)) == 0);
          if (step < 2) {  // plain: the sum itself, in rank order
            for (std::size_t i = 0; i < n; ++i) REQUIRE(out[0][i] == (x[0][i] + x[1][i]) + x[2][i]);
            continue;
          }
          std::vector<std::vector<double>> grads;
          for (const auto& g : x) grads.emplace_back(g.begin(), g.end());
          const auto want = ref.step(grads);
          const double scale = largest_magnitude(want);
          for (std::size_t i = 0; i < n; ++i) {
            CAPTURE(i);
            REQUIRE(std::fabs(static_cast<double>(out[0][i]) - want[i]) <= tolerance * scale);
            for (int w = 0; w < job; ++w)
              REQUIRE(std::fabs(static_cast<double>(states[w].residual.data()[i]) - ref.residual[w][i]) <=
                      tolerance * scale);
          }
        }
      }
    }
  }
}

TEST_CASE("compress::low_rank::buffer_plan from tensor shapes: a matrix per weight worth compressing, the rest plain",
          "[compress]") {
  using gw::shape;
  // [13, 77] at rank 2 sends 2 (13 + 77) = 180 of 1001: a matrix. [17] and [6] are vectors,
  // [3, 4] would send 2 (3 + 4) = 14 of 12, [1, 50] has one row: plain. [0, 5] is empty.
  // [2, 3, 20] is 2 rows of 60: 2 (2 + 60) = 124 of 120, plain at rank 2; at rank 1 it sends 62,
  // 120 >= 2 x 62 fails too, and with min_compression_rate 1 it is a matrix of rank 1.
  const std::vector<shape> tensors = {shape{13, 77}, shape{17}, shape{40, 30}, shape{3, 4}, shape{1, 50},
                                      shape{0, 5}, shape{6}, shape{2, 3, 20}};
  const auto plan = compress::low_rank::buffer_plan::of_tensors(tensors, 2, 2.0);
  REQUIRE(plan.n == 1001 + 17 + 1200 + 12 + 50 + 6 + 120);
  REQUIRE(plan.m_size == plan.n);
  REQUIRE(plan.matrices.size() == 2);
  CHECK((plan.matrices[0].offset == 0 && plan.matrices[0].count == 1001));
  CHECK((plan.matrices[0].shape.rows == 13 && plan.matrices[0].shape.cols == 77 && plan.matrices[0].shape.rank == 2));
  CHECK((plan.matrices[1].offset == 1018 && plan.matrices[1].shape.rows == 40 && plan.matrices[1].shape.cols == 30));
  CHECK((plan.matrices[0].p_offset == 0 && plan.matrices[1].p_offset == 26));
  CHECK((plan.matrices[0].q_offset == 0 && plan.matrices[1].q_offset == 154));
  REQUIRE(plan.plain.size() == 5);
  const std::size_t offsets[] = {1001, 2218, 2230, 2280, 2286}, counts[] = {17, 12, 50, 6, 120};
  std::size_t p_offset = 26 + 80;  // the plain stretches follow the P factors, in order
  for (std::size_t k = 0; k < plan.plain.size(); ++k) {
    CAPTURE(k);
    CHECK(plan.plain[k].offset == offsets[k]);
    CHECK(plan.plain[k].count == counts[k]);
    CHECK(plan.plain[k].p_offset == p_offset);
    p_offset += counts[k];
  }
  CHECK(plan.p_size == p_offset);
  CHECK(plan.q_size == 154 + 60);
  // The rank is capped by the smaller side (then the factors outgrow the tensor: only a rate of
  // 0 keeps it a matrix); the rate rule is what decides [2, 3, 20].
  CHECK(compress::low_rank::buffer_plan::of_tensors(std::vector<shape>{shape{3, 400}}, 8, 1.0).matrices.empty());
  const auto capped = compress::low_rank::buffer_plan::of_tensors(std::vector<shape>{shape{3, 400}}, 8, 0.0);
  REQUIRE(capped.matrices.size() == 1);
  CHECK(capped.matrices[0].shape.rank == 3);
  CHECK(compress::low_rank::buffer_plan::of_tensors(std::vector<shape>{shape{2, 3, 20}}, 1, 2.0).matrices.empty());
  const auto loose = compress::low_rank::buffer_plan::of_tensors(std::vector<shape>{shape{2, 3, 20}}, 1, 1.0);
  REQUIRE(loose.matrices.size() == 1);
  CHECK((loose.matrices[0].shape.rows == 2 && loose.matrices[0].shape.cols == 60 && loose.matrices[0].shape.rank == 1));
}

TEMPLATE_TEST_CASE("compress::powersgd planned from tensor shapes: each weight's own matrix against a float64 "
                   "reference, plain tensors summed exactly",
                   "[compress]", float, double) {
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  const double tolerance = std::is_same_v<V, float> ? 2e-3 : 1e-9;  // relative to the matrix's largest element
  constexpr int job = 3;
  const std::vector<gw::shape> tensors = {gw::shape{13, 77}, gw::shape{17}, gw::shape{40, 30}, gw::shape{3, 4}};
  const compress::powersgd codec({.rank = 2, .start_step = 1});
  std::vector<typename compress::powersgd::state<V>> states;
  for (int w = 0; w < job; ++w) states.push_back(codec.init<V>(std::span<const gw::shape>(tensors)));
  const auto& plan = states[0].plan;
  REQUIRE(plan.matrices.size() == 2);
  REQUIRE(plan.plain.size() == 2);
  const std::size_t n = plan.n;
  // Each matrix's float64 algorithm from the codec's first Q (which the ranks share).
  std::vector<reference_powersgd> refs;
  std::vector<std::vector<double>> left, right;  // each matrix's low-rank direction
  for (std::size_t k = 0; k < plan.matrices.size(); ++k) {
    const auto& a = plan.matrices[k];
    refs.push_back(reference_from<V>(states[0], job, k));
    left.push_back(normal<double>(a.shape.rows, gen));
    right.push_back(normal<double>(a.shape.cols, gen));
  }
  // Matrices of different shapes start from different Q: not one seed's values cut twice.
  REQUIRE(refs[0].q[0][0] != refs[1].q[0][0]);
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    std::vector<std::vector<V>> x;
    for (int w = 0; w < job; ++w) {
      auto g = normal<V>(n, gen, 0.1);
      for (std::size_t k = 0; k < plan.matrices.size(); ++k) {
        const auto& a = plan.matrices[k];
        for (std::size_t e = 0; e < a.count; ++e)
          g[a.offset + e] += static_cast<V>(3 * left[k][e / a.shape.cols] * right[k][e % a.shape.cols]);
      }
      x.push_back(std::move(g));
    }
    std::vector<std::span<V>> first, second;
    for (int w = 0; w < job; ++w) first.push_back(codec.low_rank_begin(states[w], std::span<const V>(x[w])));
    REQUIRE(first[0].size() == (step == 0 ? n : plan.p_size));
    sum_in_rank_order(first);
    for (int w = 0; w < job; ++w) second.push_back(codec.low_rank_middle(states[w]));
    REQUIRE(second[0].size() == (step == 0 ? 0 : plan.q_size));
    if (!second[0].empty()) sum_in_rank_order(second);
    std::vector<std::vector<V>> out(job, std::vector<V>(n));
    for (int w = 0; w < job; ++w) codec.low_rank_end(states[w], std::span<V>(out[w]));
    for (int w = 1; w < job; ++w) REQUIRE(std::memcmp(out[w].data(), out[0].data(), n * sizeof(V)) == 0);
    // Plain tensors (and every element before the start step): the sum, in rank order.
    for (std::size_t i = 0; i < n; ++i) {
      const bool in_matrix = std::any_of(plan.matrices.begin(), plan.matrices.end(),
                                         [&](const auto& a) { return i >= a.offset && i < a.offset + a.count; });
      if (step == 0 || !in_matrix) {
        CAPTURE(i);
        REQUIRE(out[0][i] == (x[0][i] + x[1][i]) + x[2][i]);
        if (step > 0)
          for (int w = 0; w < job; ++w) REQUIRE(states[w].residual.data()[i] == V(0));
      }
    }
    if (step == 0) continue;
    for (std::size_t k = 0; k < plan.matrices.size(); ++k) {
      CAPTURE(k);
      const auto& a = plan.matrices[k];
      std::vector<std::vector<double>> grads;
      for (const auto& g : x) grads.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(a.offset),
                                                 g.begin() + static_cast<std::ptrdiff_t>(a.offset + a.count));
      const auto want = refs[k].step(grads);
      const double scale = largest_magnitude(want);
      for (std::size_t e = 0; e < a.count; ++e) {
        CAPTURE(e);
        REQUIRE(std::fabs(static_cast<double>(out[0][a.offset + e]) - want[e]) <= tolerance * scale);
        for (int w = 0; w < job; ++w)
          REQUIRE(std::fabs(static_cast<double>(states[w].residual.data()[a.offset + e]) - refs[k].residual[w][e]) <=
                  tolerance * scale);
      }
    }
  }
  // A single encode reads the near-square matrix, which this state does not hold.
  std::vector<std::byte> payload(codec.encoded_bytes<V>(n));
  const auto x = normal<V>(n, gen);
  const auto [kind, what] =
      gw::testing::error_of([&] { codec.encode(states[0], std::span<const V>(x), std::span<std::byte>(payload)); });
  CHECK(kind == gw::errc::invalid_argument);
  CHECK_THAT(what, Catch::Contains("init<V>(n)"));
}

TEMPLATE_TEST_CASE("compress::powersgd: a zero gradient comes back as zeros, and the next low-rank gradient is found again",
                   "[compress]", float, double) {
  // A bucket whose gradient is zero for a step (a frozen layer, a mask) makes P = M Q zero:
  // Gram-Schmidt must leave it 0, not 0/0, and Q = M^T P comes back zero, so the next step
  // must seed Q's emptied columns again, or P = M Q stays zero and the bucket sends nothing
  // from then on.
  using V = TestType;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  const double tolerance = std::is_same_v<V, float> ? 1e-4 : 1e-12;  // relative to the largest element
  constexpr int job = 3;
  // Sizes that fill their matrix (3 x 3, 10 x 11, 32 x 32): no padding row, so l r^T below is of rank one as a matrix.
  for (std::size_t n : {std::size_t{9}, std::size_t{110}, std::size_t{1024}}) {
    for (int rank : {1, 2}) {
      CAPTURE(n, rank);
      const compress::powersgd codec({.rank = rank, .start_step = 0});
      REQUIRE(codec.shape(n).rows * codec.shape(n).cols == n);
      const auto shape = codec.shape(n);
      const auto left = normal<double>(shape.rows, gen), right = normal<double>(shape.cols, gen);
      // Rank w's gradient at step s: 0 at step 0, then (w + s) l r^T: of rank one, and so is the
      // sum over ranks, which a rank-1 approximation then holds up to rounding.
      auto gradient = [&](int w, int step) {
        std::vector<V> x(n);
        for (std::size_t k = 0; k < n; ++k)
          x[k] = step == 0 ? V(0) : static_cast<V>((w + step) * left[k / shape.cols] * right[k % shape.cols]);
        return x;
      };
      auto require_close = [&](const std::vector<V>& got, const std::vector<double>& want) {
        double largest = 0;
        for (double w : want) largest = std::max(largest, std::fabs(w));
        REQUIRE(largest > 0);
        for (std::size_t i = 0; i < n; ++i) {
          CAPTURE(i);
          REQUIRE(std::fabs(static_cast<double>(got[i]) - want[i]) <= tolerance * largest);
        }
      };
      {  // single encodes
        auto s = codec.init<V>(n);
        for (int step = 0; step < 3; ++step) {
          CAPTURE(step);
          const auto x = gradient(0, step);
          const auto payload = encode(codec, s, x);
          std::vector<V> y(n);
          codec.decode(std::span<const std::byte>(payload), std::span<V>(y));
          if (step == 0) {
            for (std::size_t i = 0; i < n; ++i) REQUIRE((y[i] == V(0) && s.residual.data()[i] == V(0)));
            continue;
          }
          require_close(y, std::vector<double>(x.begin(), x.end()));
        }
      }
      {  // the rounds of three ranks
        std::vector<typename compress::powersgd::state<V>> states;
        for (int w = 0; w < job; ++w) states.push_back(codec.init<V>(n));
        for (int step = 0; step < 3; ++step) {
          CAPTURE(step);
          std::vector<std::vector<V>> x;
          std::vector<double> want(n, 0.0);
          for (int w = 0; w < job; ++w) {
            x.push_back(gradient(w, step));
            for (std::size_t i = 0; i < n; ++i) want[i] += static_cast<double>(x.back()[i]);
          }
          std::vector<std::span<V>> first, second;
          for (int w = 0; w < job; ++w) first.push_back(codec.low_rank_begin(states[w], std::span<const V>(x[w])));
          sum_in_rank_order(first);
          for (int w = 0; w < job; ++w) second.push_back(codec.low_rank_middle(states[w]));
          sum_in_rank_order(second);
          std::vector<std::vector<V>> out(job, std::vector<V>(n));
          for (int w = 0; w < job; ++w) codec.low_rank_end(states[w], std::span<V>(out[w]));
          if (step == 0) {
            for (int w = 0; w < job; ++w)
              for (std::size_t i = 0; i < n; ++i) REQUIRE((out[w][i] == V(0) && states[w].residual.data()[i] == V(0)));
            continue;
          }
          require_close(out[0], want);
        }
      }
    }
  }
}

TEST_CASE("compress: bad options and bad buffers are refused with invalid_argument and what to do", "[compress]") {
  using gw::testing::error_of;
  for (double fraction : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(fraction);
    const auto [kind, what] = error_of([&] { compress::top_k{fraction}; });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("outside (0, 1]"));
  }
  CHECK_NOTHROW(compress::top_k{1.0});
  for (int rank : {0, -1}) {
    CAPTURE(rank);
    const auto [kind, what] = error_of([&] { compress::powersgd{{.rank = rank}}; });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("below 1"));
  }
  const compress::int8 int8;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x{1.0f, bad, 2.0f};
    const auto [kind, what] = error_of([&] { round_trip(int8, x); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("not a finite float"));
  }
  {  // a payload whose scale is NaN
    std::vector<std::byte> payload(4 + 3);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(payload.data(), &nan, sizeof nan);
    std::vector<float> out(3);
    const auto [kind, what] = error_of([&] { int8.decode(std::span<const std::byte>(payload), std::span<float>(out)); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("scale is nan"));
  }
  {  // a payload of the wrong size, a state of the wrong length
    std::vector<std::byte> payload(5);
    std::vector<float> out(3);
    const auto [kind, what] = error_of([&] { compress::fp16().decode(std::span<const std::byte>(payload), std::span<float>(out)); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("encoded_bytes"));
    const compress::error_feedback<compress::top_k> feedback;
    auto s = feedback.init<float>(4);
    std::vector<float> x(5, 1.0f);
    const auto [kind2, what2] = error_of([&] { encode(feedback, s, x); });
    CHECK(kind2 == gw::errc::invalid_argument);
    CHECK_THAT(what2, Catch::Contains("init<V>(n)"));
  }
  {  // a top-k payload naming an element beyond the buffer
    const compress::top_k top(0.5);
    std::vector<std::byte> payload(top.encoded_bytes<float>(2));
    const std::uint32_t index = 9;
    std::memcpy(payload.data(), &index, sizeof index);
    std::vector<float> out(2);
    const auto [kind, what] = error_of([&] { top.decode(std::span<const std::byte>(payload), std::span<float>(out)); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Contains("names element 9"));
  }
}
