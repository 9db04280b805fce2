// compress::low_rank::cuda against the host functions of low_rank.hpp on the same random inputs:
// one matrix (sizes 1, odd and zero-padded near-square, tall, wide, a single column) and a bucket's
// plan (several matrices between plain stretches, and a near-square one), ranks 1..4, zero columns;
// canaries and NaN poison around every output, plain stretches left as they were.
#include <gradwire/compress/cuda_low_rank.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/device_buffer.cuh"
#include "helpers/reference.hpp"

namespace {

namespace gt = gradwire::test;
namespace lr = gradwire::compress::low_rank;
namespace lrc = gradwire::compress::low_rank::cuda;
using matrix = lr::buffer_plan::matrix;

// --- tolerances ------------------------------------------------------------------------
// Both sides read the same inputs; they differ only in rounding (u: V's unit roundoff, ud:
// double's). A sum of k products accumulated in double and rounded once to V (P = M Q on both
// sides; M^T P and P Q^T on the device) is within u |result| + (k + 1) ud S of the exact
// value, S the sum of the terms' magnitudes; one accumulated in V (the host's axpys: M^T P over
// the rows, P Q^T over the rank, then minuend - ...) within (k + 2) u S (Higham's gamma_k plus
// the last rounding). Each allowance is the two sides' bounds added, times 2; S comes from the
// host function itself run in double on |inputs|.
constexpr double ud = std::numeric_limits<double>::epsilon() / 2;
template <class V>
constexpr double u = std::numeric_limits<V>::epsilon() / 2;

template <class V>
double multiply_factor(std::size_t cols) {
  return 2 * (2 * u<V> + 2 * static_cast<double>(cols + 1) * ud);
}
template <class V>
double accumulated_factor(std::size_t k) {  // host in V over k terms, device in double
  return 2 * (static_cast<double>(k + 3) * u<V> + static_cast<double>(k + 1) * ud);
}
// Gram-Schmidt: each of the 2c projections and the scaling rounds each element on both sides
// (the dots themselves agree to double precision before their one rounding to V); an error
// of u in a column is magnified by at most ||p_c|| / (its distance to the earlier columns),
// below 5 for the columns that orthogonalise_input draws. Absolute (the columns end with
// length 1): 128 (r + 1) u leaves more than a factor 2 for that; a projection on the wrong
// column or a missed pass moves elements by 1e-3 or more.
template <class V>
double orthogonalise_allowance(std::size_t rank) {
  return 128 * static_cast<double>(rank + 1) * u<V>;
}

// --- inputs ----------------------------------------------------------------------------
template <class V>
std::vector<V> random_values(gt::random_engine& rng, std::size_t n) {
  std::vector<V> v(n);
  for (auto& x : v) x = rng.value<V>(-1.0, 1.0);
  return v;
}

template <class V>
std::vector<double> magnitudes(const std::vector<V>& x) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = std::abs(static_cast<double>(x[i]));
  return out;
}

std::vector<double> times(const std::vector<double>& s, double factor) {
  std::vector<double> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = s[i] * factor;
  return out;
}

template <class V>
std::unique_ptr<gt::device_guarded<V>> on_device(const std::vector<V>& x) {
  auto d = std::make_unique<gt::device_guarded<V>>(x.size());
  d->upload(x);
  return d;
}
template <class V>
std::unique_ptr<gt::device_guarded<V>> poisoned(std::size_t n) {
  auto d = std::make_unique<gt::device_guarded<V>>(n);
  d->poison();
  return d;
}

// P's columns each led by 2 sqrt(rows) + 2 at a row of their own over noise in [-1, 1): no
// two at a cosine above about 0.45 (rows = rank = 3; 1.3 / sqrt(rows) for many rows), so
// the result depends on the inputs smoothly enough for a tight comparison, and the
// projections still move every element (by about 1 / rows).
template <class V>
void orthogonalise_input(gt::random_engine& rng, V* p, const lr::matrix_shape& s, std::size_t zero_column) {
  const double lead = 2 * std::sqrt(static_cast<double>(s.rows)) + 2;
  for (std::size_t c = 0; c < s.rank; ++c)
    for (std::size_t i = 0; i < s.rows; ++i)
      p[c * s.rows + i] = c == zero_column ? V(0) : static_cast<V>(rng.uniform(-1.0, 1.0) + (i == c ? lead : 0.0));
}

// Q's columns by c mod 3: all zero (the first element -0.0, which counts as zero), random,
// zero but for the last element (not empty: left alone).
template <class V>
void seed_input(gt::random_engine& rng, V* q, const lr::matrix_shape& s) {
  for (std::size_t c = 0; c < s.rank; ++c)
    for (std::size_t j = 0; j < s.cols; ++j) {
      V& x = q[c * s.cols + j];
      if (c % 3 == 1)
        x = rng.value<V>(-1.0, 1.0);
      else if (c % 3 == 2)
        x = j + 1 == s.cols ? V(0.5) : V(0);
      else
        x = j == 0 ? -V(0) : V(0);
    }
}

template <class V>
void require_bits(const std::vector<V>& got, const std::vector<V>& want) {
  REQUIRE(got.size() == want.size());
  REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(V)) == 0);
}

// Device columns orthonormal except the zero one: |p_b . p_c - [b == c]| <= 16 (rows + r) u.
template <class V>
void require_orthonormal(const V* p, const lr::matrix_shape& s, std::size_t zero_column) {
  for (std::size_t b = 0; b < s.rank; ++b)
    for (std::size_t c = 0; c <= b; ++c) {
      if (b == zero_column || c == zero_column) continue;
      double dot = 0;
      for (std::size_t i = 0; i < s.rows; ++i) dot += static_cast<double>(p[b * s.rows + i]) * p[c * s.rows + i];
      CAPTURE(b, c, dot);
      REQUIRE(std::abs(dot - (b == c ? 1.0 : 0.0)) <= 16 * static_cast<double>(s.rows + s.rank) * u<V>);
    }
}

struct one_case {
  lr::matrix_shape shape;
  std::size_t n;  // elements of the buffer (rows cols but for a padded near-square matrix)
};
std::vector<one_case> single_cases(std::size_t r) {
  std::vector<one_case> out;
  for (std::size_t n : {1, 7, 1000, 4099}) out.push_back({lr::matrix_shape::of(n, r), n});
  for (auto [rows, cols] : {std::pair<std::size_t, std::size_t>{257, 33}, {3, 500}, {40, 1}})
    out.push_back({lr::matrix_shape::of_matrix(rows, cols, r), rows * cols});
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("low_rank::cuda: multiply, multiply_transposed and reconstruct on one matrix against the host",
                   "[cuda][compress][low_rank]", float, double) {
  using V = TestType;
  GRADWIRE_TEST_RNG(rng);
  gradwire::cuda::stream stream;
  for (std::size_t r = 1; r <= 4; ++r)
    for (const auto& [s, n] : single_cases(r)) {
      CAPTURE(r, s.rows, s.cols, s.rank, n);
      auto m = random_values<V>(rng, s.rows * s.cols);
      std::fill(m.begin() + static_cast<std::ptrdiff_t>(n), m.end(), V(0));  // the padding of a near-square M
      const auto p = random_values<V>(rng, s.p_size()), q = random_values<V>(rng, s.q_size());
      const auto minuend = random_values<V>(rng, n);
      const auto m_d = on_device(m), p_d = on_device(p), q_d = on_device(q), minuend_d = on_device(minuend);
      const auto m_abs = magnitudes(m), p_abs = magnitudes(p), q_abs = magnitudes(q);

      {  // P = M Q
        auto got = poisoned<V>(s.p_size());
        lrc::multiply(m_d->data(), q_d->data(), got->data(), s, stream);
        std::vector<V> want(s.p_size());
        std::vector<double> bound(s.p_size());
        lr::multiply<V>(m, q, want, s);
        lr::multiply<double>(m_abs, q_abs, bound, s);
        gt::require_close(got->download(), gt::widen<V>(want), times(bound, multiply_factor<V>(s.cols)));
        REQUIRE(got->intact());
      }
      {  // Q = M^T P
        auto got = poisoned<V>(s.q_size());
        lrc::multiply_transposed(m_d->data(), p_d->data(), got->data(), s, stream);
        std::vector<V> want(s.q_size());
        std::vector<double> bound(s.q_size());
        lr::multiply_transposed<V>(m, p, want, s);
        lr::multiply_transposed<double>(m_abs, p_abs, bound, s);
        gt::require_close(got->download(), gt::widen<V>(want), times(bound, accumulated_factor<V>(s.rows)));
        REQUIRE(got->intact());
      }
      // P Q^T; minuend - P Q^T into another buffer and in place (minuend = out).
      std::vector<V> want(n), want_minus(n);
      std::vector<double> bound(n);
      lr::reconstruct<V>(p, q, want, s);
      lr::reconstruct<V>(p, q, want_minus, s, minuend.data());
      lr::reconstruct<double>(p_abs, q_abs, bound, s);
      auto got = poisoned<V>(n), got_minus = poisoned<V>(n), in_place = on_device(minuend);
      lrc::reconstruct(p_d->data(), q_d->data(), got->data(), n, s, stream);
      lrc::reconstruct(p_d->data(), q_d->data(), got_minus->data(), n, s, stream, minuend_d->data());
      lrc::reconstruct(p_d->data(), q_d->data(), in_place->data(), n, s, stream, in_place->data());
      gt::require_close(got->download(), gt::widen<V>(want), times(bound, accumulated_factor<V>(s.rank)));
      std::vector<double> allowed(n);
      for (std::size_t i = 0; i < n; ++i)
        allowed[i] = (bound[i] + std::abs(static_cast<double>(minuend[i]))) * accumulated_factor<V>(s.rank);
      gt::require_close(got_minus->download(), gt::widen<V>(want_minus), allowed);
      gt::require_close(in_place->download(), gt::widen<V>(want_minus), allowed);
      REQUIRE((got->intact() && got_minus->intact() && in_place->intact()));
    }
}

TEMPLATE_TEST_CASE("low_rank::cuda::orthogonalise on one matrix against the host; a zero column stays 0",
                   "[cuda][compress][low_rank]", float, double) {
  using V = TestType;
  GRADWIRE_TEST_RNG(rng);
  gradwire::cuda::stream stream;
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  for (std::size_t r = 1; r <= 4; ++r)
    for (const auto& [s, n] : single_cases(r))
      for (std::size_t zero : {none, r == 3 ? std::size_t{0} : s.rank - 1}) {
        CAPTURE(r, s.rows, s.cols, s.rank, zero);
        std::vector<V> want(s.p_size());
        orthogonalise_input(rng, want.data(), s, zero);
        const auto got = on_device(want);
        lrc::orthogonalise(got->data(), s, stream);
        lr::orthogonalise<V>(want, s);
        std::vector<double> allowed(s.p_size(), orthogonalise_allowance<V>(s.rank));
        if (zero != none) std::fill_n(allowed.begin() + static_cast<std::ptrdiff_t>(zero * s.rows), s.rows, 0.0);
        const auto back = got->download();
        gt::require_close(back, gt::widen<V>(want), allowed);  // allowed 0: exactly 0
        require_orthonormal(back.data(), s, zero);
        REQUIRE(got->intact());
      }
}

TEMPLATE_TEST_CASE("low_rank::cuda::seed_empty_columns writes the host's values bit for bit",
                   "[cuda][compress][low_rank]", float, double) {
  using V = TestType;
  GRADWIRE_TEST_RNG(rng);
  gradwire::cuda::stream stream;
  for (std::size_t r = 1; r <= 4; ++r)
    for (const auto& [s, n] : single_cases(r)) {
      const std::uint64_t seed = rng.engine()();
      CAPTURE(r, s.rows, s.cols, s.rank, seed);
      std::vector<V> want(s.q_size());
      seed_input(rng, want.data(), s);
      const auto got = on_device(want);
      lrc::seed_empty_columns(got->data(), s, seed, stream);
      lr::seed_empty_columns<V>(want, s, seed);
      require_bits(got->download(), want);
      REQUIRE(got->intact());
    }
}

TEMPLATE_TEST_CASE("low_rank::cuda on a bucket's plan: every matrix in one launch per operation against the host, "
                   "plain stretches untouched",
                   "[cuda][compress][low_rank]", float, double) {
  using V = TestType;
  GRADWIRE_TEST_RNG(rng);
  gradwire::cuda::stream stream;
  const std::vector<gradwire::shape> tensors{{64, 30}, {30}, {3, 3, 5}, {100, 7}, {5}, {33, 65}, {1, 200}, {257, 40}};
  constexpr std::uint64_t seed_step = 0xD1B5'4A32'D192'ED03ull;  // powersgd's seed_of
  for (std::size_t r = 1; r <= 4; ++r)
    for (const auto& plan : {lr::buffer_plan::of_tensors(tensors, r), lr::buffer_plan::near_square(1000, r)}) {
      CAPTURE(r, plan.matrices.size(), plan.plain.size(), plan.n);
      REQUIRE((plan.matrices.size() >= 3 || plan.plain.empty()));
      const lrc::device_plan on(plan, stream);
      REQUIRE(on.matrices() == static_cast<int>(plan.matrices.size()));
      const auto p_of = [](auto& v, const matrix& a) { return std::span(v).subspan(a.p_offset, a.shape.p_size()); };
      const auto q_of = [](auto& v, const matrix& a) { return std::span(v).subspan(a.q_offset, a.shape.q_size()); };
      const auto m_of = [](auto& v, const matrix& a) {
        return std::span(v).subspan(a.offset, a.shape.rows * a.shape.cols);
      };

      auto m = random_values<V>(rng, plan.m_size);
      std::fill(m.begin() + static_cast<std::ptrdiff_t>(plan.n), m.end(), V(0));
      const auto p = random_values<V>(rng, plan.p_size), q = random_values<V>(rng, plan.q_size);
      const auto m_d = on_device(m), p_d = on_device(p), q_d = on_device(q);
      const auto m_abs = magnitudes(m), p_abs = magnitudes(p), q_abs = magnitudes(q);

      {  // seed: matrix k from seed + seed_step k
        const std::uint64_t seed = rng.engine()();
        std::vector<V> want = q;
        for (const auto& a : plan.matrices) seed_input(rng, q_of(want, a).data(), a.shape);
        const auto got = on_device(want);
        lrc::seed_empty_columns(on, got->data(), seed, seed_step, stream);
        for (std::size_t k = 0; k < plan.matrices.size(); ++k)
          lr::seed_empty_columns<V>(q_of(want, plan.matrices[k]), plan.matrices[k].shape, seed + seed_step * k);
        require_bits(got->download(), want);
      }
      {  // P = M Q; the plain stretches after the factors keep their values (allowed 0)
        const auto got = on_device(p);
        lrc::multiply(on, m_d->data(), q_d->data(), got->data(), stream);
        std::vector<V> want = p;
        std::vector<double> bound(plan.p_size), allowed(plan.p_size);
        for (const auto& a : plan.matrices) {
          lr::multiply<V>(m_of(m, a), q_of(q, a), p_of(want, a), a.shape);
          lr::multiply<double>(m_of(m_abs, a), q_of(q_abs, a), p_of(bound, a), a.shape);
          for (std::size_t i = 0; i < a.shape.p_size(); ++i)
            allowed[a.p_offset + i] = bound[a.p_offset + i] * multiply_factor<V>(a.shape.cols);
        }
        gt::require_close(got->download(), gt::widen<V>(want), allowed);
        REQUIRE(got->intact());
      }
      {  // Gram-Schmidt of every matrix's P, a zero column in the second
        std::vector<V> want = p;
        std::vector<double> allowed(plan.p_size);
        for (std::size_t k = 0; k < plan.matrices.size(); ++k) {
          const auto& a = plan.matrices[k];
          orthogonalise_input(rng, p_of(want, a).data(), a.shape, k == 1 ? a.shape.rank - 1 : a.shape.rank);
          std::fill_n(p_of(allowed, a).begin(), a.shape.p_size(), orthogonalise_allowance<V>(a.shape.rank));
          if (k == 1) std::fill_n(p_of(allowed, a).end() - static_cast<std::ptrdiff_t>(a.shape.rows), a.shape.rows, 0.0);
        }
        const auto got = on_device(want);
        lrc::orthogonalise(on, got->data(), stream);
        for (const auto& a : plan.matrices) lr::orthogonalise<V>(p_of(want, a), a.shape);
        gt::require_close(got->download(), gt::widen<V>(want), allowed);
        REQUIRE(got->intact());
      }
      {  // Q = M^T P
        const auto got = poisoned<V>(plan.q_size);
        lrc::multiply_transposed(on, m_d->data(), p_d->data(), got->data(), stream);
        std::vector<V> want(plan.q_size);
        std::vector<double> bound(plan.q_size), allowed(plan.q_size);
        for (const auto& a : plan.matrices) {
          lr::multiply_transposed<V>(m_of(m, a), p_of(p, a), q_of(want, a), a.shape);
          lr::multiply_transposed<double>(m_of(m_abs, a), p_of(p_abs, a), q_of(bound, a), a.shape);
          for (std::size_t i = 0; i < a.shape.q_size(); ++i)
            allowed[a.q_offset + i] = bound[a.q_offset + i] * accumulated_factor<V>(a.shape.rows);
        }
        gt::require_close(got->download(), gt::widen<V>(want), allowed);
        REQUIRE(got->intact());
      }
      {  // the residual: out = M - P Q^T over each matrix's count, the plain stretches untouched
        const auto before = random_values<V>(rng, plan.n);
        const auto got = on_device(before);
        lrc::reconstruct(on, p_d->data(), q_d->data(), got->data(), stream, m_d->data());
        std::vector<V> want = before;
        std::vector<double> bound(plan.n), allowed(plan.n);
        for (const auto& a : plan.matrices) {
          const auto out = std::span(want).subspan(a.offset, a.count);
          lr::reconstruct<V>(p_of(p, a), q_of(q, a), out, a.shape, m.data() + a.offset);
          lr::reconstruct<double>(p_of(p_abs, a), q_of(q_abs, a), std::span(bound).subspan(a.offset, a.count), a.shape);
          for (std::size_t i = a.offset; i < a.offset + a.count; ++i)
            allowed[i] = (bound[i] + m_abs[i]) * accumulated_factor<V>(a.shape.rank);
        }
        gt::require_close(got->download(), gt::widen<V>(want), allowed);
        REQUIRE(got->intact());
      }
    }
}
