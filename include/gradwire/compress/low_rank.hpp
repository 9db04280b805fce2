// The host maths of a low-rank approximation M ~ P Q^T (PowerSGD's steps), as plain functions over spans.
//
// Layout: M is rows x cols, row-major (a buffer's elements in order, zero-padded to fill the
// last row); the factors P (rows x r) and Q (cols x r) are column-major, each column
// contiguous, so that every loop below runs along contiguous memory: P = M Q is r dot
// products per row of M, Q = M^T P and P Q^T are axpys along M's rows, and Gram-Schmidt
// works on whole columns. An aggregation calls them between its all-reduces (PowerSGD:
// P = M Q; all-reduce P; orthogonalise P; Q = M^T P; all-reduce Q; M' = P Q^T), a codec
// around a single encode. Dot products and norms accumulate in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../error.hpp"
#include "../kernels/host.hpp"
#include "../tensor/shape.hpp"

namespace gradwire::compress::low_rank {

// The matrix a buffer of n elements is read as: cols = ceil(sqrt(n)), rows = ceil(n / cols),
// so rows <= cols, the last row padded with fewer than cols zeros, and the factors of rank r
// hold r (rows + cols), about 2 r sqrt(n), elements. A near-square shape needs no knowledge
// of the tensors in a bucket and gives the most compression a given rank can (rows + cols
// is smallest for rows = cols). `rank` is min(the rank asked for, rows): beyond rows, P Q^T
// is exact already.
struct matrix_shape {
  std::size_t rows = 0, cols = 0, rank = 0;

  static matrix_shape of(std::size_t n, std::size_t wanted_rank) noexcept {
    if (n == 0) return {};
    auto cols = static_cast<std::size_t>(std::sqrt(static_cast<double>(n)));
    while (cols * cols < n) ++cols;
    while (cols > 1 && (cols - 1) * (cols - 1) >= n) --cols;
    const std::size_t rows = (n + cols - 1) / cols;
    return {rows, cols, std::min(wanted_rank, rows)};
  }
  // A tensor's own matrix: `rows` by `cols` (shape[0] by the product of the other extents),
  // rank at most min(rows, cols).
  static matrix_shape of_matrix(std::size_t rows, std::size_t cols, std::size_t wanted_rank) noexcept {
    return {rows, cols, std::min({wanted_rank, rows, cols})};
  }
  std::size_t p_size() const noexcept { return rows * rank; }
  std::size_t q_size() const noexcept { return cols * rank; }
};

// A tensor is a matrix of its own only where its elements are at least this many times its
// factors' r (rows + cols) (PyTorch's PowerSGDState.min_compression_rate, the same default).
inline constexpr double default_min_compression_rate = 2;

// How a buffer is reduced as factors: matrices (each a stretch of the buffer, its factors
// at their own places in the two rounds) and stretches sent plain, summed in the first
// round after the P factors. A plan of one near-square matrix (near_square) needs nothing
// but n; a plan from the tensors' shapes (of_tensors) follows PyTorch's PowerSGD hook: each
// tensor of two or more axes is its own matrix, shape[0] rows, if its factors save at least
// `min_compression_rate` times its elements, and vectors (biases) and small matrices go plain.
// A tensor's own matrix keeps its rows and columns apart, where a bucket read as one matrix
// mixes tensors in its rows and spends the rank on their boundaries.
struct buffer_plan {
  struct matrix {
    std::size_t offset = 0, count = 0;  // the stretch of the buffer (count <= rows cols: padded)
    matrix_shape shape;
    std::size_t p_offset = 0, q_offset = 0;  // where its P and Q sit in the rounds
  };
  struct stretch {
    std::size_t offset = 0, count = 0, p_offset = 0;
  };
  std::size_t n = 0;
  std::vector<matrix> matrices;
  std::vector<stretch> plain;
  std::size_t m_size = 0;  // M's elements: n, or rows cols of a padded near-square matrix
  std::size_t p_size = 0;  // the first round: the P factors, then the plain stretches
  std::size_t q_size = 0;  // the second round: the Q factors (0: no second round)

  // (n = 0: one empty matrix.)
  static buffer_plan near_square(std::size_t n, std::size_t wanted_rank) {
    buffer_plan plan;
    plan.n = n;
    const matrix_shape s = matrix_shape::of(n, wanted_rank);
    plan.matrices.push_back({0, n, s, 0, 0});
    plan.m_size = s.rows * s.cols;
    plan.p_size = s.p_size();
    plan.q_size = s.q_size();
    return plan;
  }

  static buffer_plan of_tensors(std::span<const shape> tensors, std::size_t wanted_rank,
                                double min_compression_rate = default_min_compression_rate) {
    buffer_plan plan;
    std::size_t offset = 0;
    for (const shape& t : tensors) {
      const std::size_t count = t.elements();
      if (count == 0) continue;
      const std::size_t rows = t.rank() >= 2 ? t[0] : 0, cols = rows ? count / rows : 0;
      const matrix_shape s = matrix_shape::of_matrix(rows, cols, wanted_rank);
      const double sent = static_cast<double>(s.p_size() + s.q_size());
      if (rows >= 2 && cols >= 2 && static_cast<double>(count) >= min_compression_rate * sent) {
        plan.matrices.push_back({offset, count, s, plan.p_size, plan.q_size});
        plan.p_size += s.p_size();
        plan.q_size += s.q_size();
      } else {
        plan.plain.push_back({offset, count, 0});
      }
      offset += count;
    }
    for (stretch& p : plan.plain) {
      p.p_offset = plan.p_size;
      plan.p_size += p.count;
    }
    plan.n = plan.m_size = offset;
    return plan;
  }
};

// sum_j a[j] b[j] in double (a product of two floats is exact there): sixteen running sums,
// lane j mod 16, added pairwise at the end. A fixed order, so the same bits whatever the
// vector width (and with or without a fused multiply-add: the products are exact), and
// sixteen independent chains where one would wait on each addition's latency.
template <class V>
double dot(const V* GRADWIRE_RESTRICT a, const V* GRADWIRE_RESTRICT b, std::size_t n) noexcept {
  constexpr std::size_t lanes = 16;
  double sum[lanes] = {};
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes)
#if defined(__GNUC__)  // unrolled, the sums stay in registers (else GCC keeps them in memory)
#pragma GCC unroll 16
#endif
    for (std::size_t l = 0; l < lanes; ++l) sum[l] += static_cast<double>(a[j + l]) * static_cast<double>(b[j + l]);
  for (std::size_t l = 0; j < n; ++j, ++l) sum[l] += static_cast<double>(a[j]) * static_cast<double>(b[j]);
  for (std::size_t width = lanes / 2; width > 0; width /= 2)
    for (std::size_t l = 0; l < width; ++l) sum[l] += sum[l + width];
  return sum[0];
}

// P = M Q: column c of P at p[c rows ..], of Q at q[c cols ..]. Row by row, so that M is
// read from memory once (the row stays in L1 for its r products).
template <class V>
void multiply(std::span<const V> m, std::span<const V> q, std::span<V> p, const matrix_shape& s) {
  for (std::size_t i = 0; i < s.rows; ++i) {
    const V* row = m.data() + i * s.cols;
    for (std::size_t c = 0; c < s.rank; ++c) p[c * s.rows + i] = static_cast<V>(dot(row, q.data() + c * s.cols, s.cols));
  }
}

// y[j] += alpha x[j], in steps of a fixed 16 (as the codecs' loops: vectorised at -O2 with
// or without the gradwire target's -fopenmp-simd) and a remainder.
template <class V>
void axpy(V alpha, const V* GRADWIRE_RESTRICT x, V* GRADWIRE_RESTRICT y, std::size_t n) noexcept {
  constexpr std::size_t step = 16;
  std::size_t i = 0;
  for (; i + step <= n; i += step)
    GRADWIRE_VECTORIZE
    for (std::size_t j = i; j < i + step; ++j) y[j] += x[j] * alpha;
  for (; i < n; ++i) y[i] += x[i] * alpha;
}

// Q = M^T P, row by row as multiply (each element of Q sums over the rows in order).
template <class V>
void multiply_transposed(std::span<const V> m, std::span<const V> p, std::span<V> q, const matrix_shape& s) {
  std::fill(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(s.q_size()), V(0));
  for (std::size_t i = 0; i < s.rows; ++i) {
    const V* row = m.data() + i * s.cols;
    for (std::size_t c = 0; c < s.rank; ++c) axpy(p[c * s.rows + i], row, q.data() + c * s.cols, s.cols);
  }
}

// P's columns made orthonormal in place, in order (modified Gram-Schmidt: each column
// loses its projections on the ones before it, then is scaled to length 1). The projections
// are taken off twice ("twice is enough", Giraud et al. 2005): once leaves an error of about
// eps cond(P), and P = M Q of an ill-conditioned M would come out far from orthonormal in
// float, so P P^T would not be a projection; twice leaves about eps, for r^2 rows more work
// against the products' r n. A column left with length 0 (M of lower rank than r, or zero)
// stays 0 rather than NaN.
template <class V>
void orthogonalise(std::span<V> p, const matrix_shape& s) {
  for (std::size_t c = 0; c < s.rank; ++c) {
    V* pc = p.data() + c * s.rows;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t b = 0; b < c; ++b) {
        const V* pb = p.data() + b * s.rows;
        double dot = 0;
        for (std::size_t i = 0; i < s.rows; ++i) dot += static_cast<double>(pc[i]) * static_cast<double>(pb[i]);
        const auto d = static_cast<V>(dot);
        for (std::size_t i = 0; i < s.rows; ++i) pc[i] -= d * pb[i];
      }
    double norm = 0;
    for (std::size_t i = 0; i < s.rows; ++i) norm += static_cast<double>(pc[i]) * static_cast<double>(pc[i]);
    norm = std::sqrt(norm);
    const V inverse = norm > 0 ? static_cast<V>(1 / norm) : V(0);
    for (std::size_t i = 0; i < s.rows; ++i) pc[i] *= inverse;
  }
}

// y[j] = x[j] - y[j]
template <class V>
void subtract_from(const V* GRADWIRE_RESTRICT x, V* GRADWIRE_RESTRICT y, std::size_t n) noexcept {
  constexpr std::size_t step = 16;
  std::size_t i = 0;
  for (; i + step <= n; i += step)
    GRADWIRE_VECTORIZE
    for (std::size_t j = i; j < i + step; ++j) y[j] = x[j] - y[j];
  for (; i < n; ++i) y[i] = x[i] - y[i];
}

// out = the first out.size() elements of P Q^T, row-major (out.size() <= rows cols); with
// `minuend`, out = minuend - P Q^T instead, row by row while the row is in L1.
template <class V>
void reconstruct(std::span<const V> p, std::span<const V> q, std::span<V> out, const matrix_shape& s,
                 const V* minuend = nullptr) {
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < s.rows && i * s.cols < n; ++i) {
    V* row = out.data() + i * s.cols;
    const std::size_t length = std::min(s.cols, n - i * s.cols);
    std::fill(row, row + length, V(0));
    for (std::size_t c = 0; c < s.rank; ++c) axpy(p[c * s.rows + i], q.data() + c * s.cols, row, length);
    if (minuend) subtract_from(minuend + i * s.cols, row, length);
  }
}

// Fills the columns of Q that are all zero with values in [-1, 1) from `seed` (splitmix64
// of seed and the element's place): the first Q of a warm start, and a column that a zero
// gradient emptied (else P = M Q would keep it zero for good). A function of the seed and
// Q alone, so ranks that agree on Q agree after it too.
template <class V>
void seed_empty_columns(std::span<V> q, const matrix_shape& s, std::uint64_t seed) {
  for (std::size_t c = 0; c < s.rank; ++c) {
    V* qc = q.data() + c * s.cols;
    if (std::any_of(qc, qc + s.cols, [](V x) { return x != V(0); })) continue;
    for (std::size_t j = 0; j < s.cols; ++j) {
      std::uint64_t z = seed + 0x9E37'79B9'7F4A'7C15ull * (c * s.cols + j + 1);
      z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
      z ^= z >> 31;
      qc[j] = static_cast<V>(static_cast<double>(z >> 11) * 0x1p-52 - 1.0);  // 53 bits: [0, 2) - 1
    }
  }
}

}  // namespace gradwire::compress::low_rank
