// compress::low_rank's maths (low_rank.hpp) on device memory: P = M Q, Q = M^T P, Gram-Schmidt, P Q^T, Q's seeding.
//
// The same layout as the host (M row-major, zero-padded to fill its last row; P rows x r and
// Q cols x r column-major), so a device state and a host state are interchangeable, and the
// same kind of arithmetic: dot products and norms in double (in another order: 32 lanes and a
// shuffle tree against the host's 16 lanes, so not the same bits), Q's seed values bit for bit
// (splitmix64 of the seed and the element's place). Where the host sums in V (Q = M^T P and
// P Q^T are axpys there) the device sums in double and rounds once: closer, not the same bits.
//
// Layers, as in kernels/cuda.cuh: warp and block sums in double (shuffles, no CUB) -> one
// kernel per operation, over a table of matrices, each thread block (or warp) finding its
// matrix by a binary search of the table's work prefix sums -> a dispatch that sizes the grid -> thin public entries,
// for one matrix (a matrix_shape, passed by value in the launch) or for every matrix of a
// bucket's buffer_plan (a device_plan, uploaded once at init): one launch per operation per
// bucket, whatever the number of tensors. Orthogonalisation is one block per matrix, the
// columns in order as on the host (modified Gram-Schmidt, twice): r^2 block reductions, so
// a matrix of very many rows is one SM's work. All calls are asynchronous on `stream`.
// V: float or double (as the host codec's).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../cuda/runtime.cuh"
// low_rank.hpp's `#pragma GCC unroll` is for the host compiler; nvcc's front end does not know it (warning 1675).
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#include "low_rank.hpp"
#pragma nv_diagnostic pop

namespace gradwire::compress::low_rank::cuda {

inline constexpr int block_threads = 256;

namespace detail {

inline constexpr int warp_threads = 32;
inline constexpr int warps_per_block = block_threads / warp_threads;
// Ranks one pass over M serves: a row (or column) of M is read once per `chunk` columns of the factors.
inline constexpr int chunk = 4;

template <class V>
inline constexpr bool is_low_rank_element_v = std::is_same_v<V, float> || std::is_same_v<V, double>;

// The units of work a matrix is split into, one kind per kernel.
enum unit : int { by_row, by_tile, by_element, by_column, unit_kinds };

// One matrix of a plan, with where its work starts in each kernel's numbering.
struct matrix_desc {
  std::size_t offset = 0, count = 0;        // its stretch of M and of the output
  std::size_t rows = 0, cols = 0, rank = 0;
  std::size_t p_offset = 0, q_offset = 0;   // its factors in P and Q
  std::size_t begin[unit_kinds] = {};       // rows (P = M Q), 32-column tiles (Q = M^T P), elements, Q columns
};

inline std::size_t units(const matrix_desc& a, int kind) noexcept {
  switch (kind) {
    case by_row: return a.rows;
    case by_tile: return (a.cols + warp_threads - 1) / warp_threads;
    case by_element: return a.count;
    default: return a.rank;
  }
}

// Fills in the prefix sums; returns the totals.
struct totals {
  std::size_t of[unit_kinds] = {};
};
inline totals number(std::vector<matrix_desc>& table) noexcept {
  totals t;
  for (matrix_desc& a : table)
    for (int k = 0; k < unit_kinds; ++k) {
      a.begin[k] = t.of[k];
      t.of[k] += a.rank ? units(a, k) : 0;
    }
  return t;
}

inline matrix_desc describe(const matrix_shape& s, std::size_t count, std::size_t offset = 0, std::size_t p_offset = 0,
                            std::size_t q_offset = 0) noexcept {
  matrix_desc a;
  a.offset = offset;
  a.count = count;
  a.rows = s.rows;
  a.cols = s.cols;
  a.rank = s.rank;
  a.p_offset = p_offset;
  a.q_offset = q_offset;
  return a;
}

// The two tables a kernel reads: one matrix in the launch's parameters, or a plan's in device memory.
struct one_matrix {
  matrix_desc a;
  __device__ int size() const { return 1; }
  __device__ const matrix_desc& operator[](int) const { return a; }
};
struct matrix_table {
  const matrix_desc* a;
  int n;
  __device__ int size() const { return n; }
  __device__ const matrix_desc& operator[](int k) const { return a[k]; }
};

// The last matrix whose work starts at or before `at` (one with no work of this kind shares
// its start with the next, which is the one found).
template <class Table>
__device__ int locate(const Table& t, std::size_t at, int kind) {
  int lo = 0, hi = t.size() - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t[mid].begin[kind] <= at)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// --- warp and block level: sums in double, in a fixed order (the same bits run to run) ---
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = warp_threads / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;  // in every lane
}

// Written here, not cub::BlockReduce: its header doubles what this header costs an including
// TU under nvcc (4.1 s against 1.9 s of CPU time for a TU of this header alone) for ten lines.
struct block_storage {
  double warp[warps_per_block];
};
// The block's sum, in every thread (each warp's sum, then the warps' in order); the storage is
// free again on return.
__device__ __forceinline__ double block_sum(double x, block_storage& storage) {
  x = warp_sum(x);
  if (threadIdx.x % warp_threads == 0) storage.warp[threadIdx.x / warp_threads] = x;
  __syncthreads();
  double total = 0;
#pragma unroll
  for (int w = 0; w < warps_per_block; ++w) total += storage.warp[w];
  __syncthreads();
  return total;
}

// --- kernels -----------------------------------------------------------------------------
__device__ __forceinline__ int live_ranks(std::size_t left) { return left < chunk ? static_cast<int>(left) : chunk; }

// P = M Q: a warp per row of M, `chunk` dot products per pass along the row.
template <class V, class Table>
__global__ void __launch_bounds__(block_threads) multiply_kernel(Table t, const V* m, const V* q, V* p, std::size_t rows) {
  const unsigned lane = threadIdx.x % warp_threads;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * warps_per_block;
  for (std::size_t w = static_cast<std::size_t>(blockIdx.x) * warps_per_block + threadIdx.x / warp_threads; w < rows;
       w += warps) {
    const matrix_desc& a = t[locate(t, w, by_row)];
    const std::size_t i = w - a.begin[by_row];
    const V* row = m + a.offset + i * a.cols;
    const V* qa = q + a.q_offset;
    for (std::size_t c0 = 0; c0 < a.rank; c0 += chunk) {
      const int live = live_ranks(a.rank - c0);
      double sum[chunk] = {};
      for (std::size_t j = lane; j < a.cols; j += warp_threads) {
        const double x = row[j];
#pragma unroll
        for (int k = 0; k < chunk; ++k)
          if (k < live) sum[k] += x * static_cast<double>(qa[(c0 + k) * a.cols + j]);
      }
#pragma unroll
      for (int k = 0; k < chunk; ++k) {
        const double total = warp_sum(sum[k]);
        if (lane == 0 && k < live) p[a.p_offset + (c0 + k) * a.rows + i] = static_cast<V>(total);
      }
    }
  }
}

// Q = M^T P: a block per 32 columns of M, its warps each summing every 8th row, the 8 partial
// sums added in warp order: loads of M's rows coalesce, P's elements are broadcast.
template <class V, class Table>
__global__ void __launch_bounds__(block_threads)
    multiply_transposed_kernel(Table t, const V* m, const V* p, V* q, std::size_t tiles) {
  __shared__ double partial[warps_per_block][chunk][warp_threads];
  const unsigned lane = threadIdx.x % warp_threads, warp = threadIdx.x / warp_threads;
  for (std::size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const matrix_desc& a = t[locate(t, tile, by_tile)];
    const std::size_t j = (tile - a.begin[by_tile]) * warp_threads + lane;
    const bool inside = j < a.cols;
    const V* ma = m + a.offset;
    const V* pa = p + a.p_offset;
    for (std::size_t c0 = 0; c0 < a.rank; c0 += chunk) {
      const int live = live_ranks(a.rank - c0);
      double sum[chunk] = {};
      if (inside)
        for (std::size_t i = warp; i < a.rows; i += warps_per_block) {
          const double x = ma[i * a.cols + j];
#pragma unroll
          for (int k = 0; k < chunk; ++k)
            if (k < live) sum[k] += x * static_cast<double>(pa[(c0 + k) * a.rows + i]);
        }
#pragma unroll
      for (int k = 0; k < chunk; ++k) partial[warp][k][lane] = sum[k];
      __syncthreads();
      if (warp == 0 && inside)
        for (int k = 0; k < live; ++k) {
          double total = 0;
#pragma unroll
          for (int w = 0; w < warps_per_block; ++w) total += partial[w][k][lane];
          q[a.q_offset + (c0 + k) * a.cols + j] = static_cast<V>(total);
        }
      __syncthreads();  // partial is written again by the next chunk or tile
    }
  }
}

// Modified Gram-Schmidt, twice, on P's columns in order: a block per matrix. Each thread
// keeps to the same rows throughout, so only the reductions cross threads.
template <class V, class Table>
__global__ void __launch_bounds__(block_threads) orthogonalise_kernel(Table t, V* p) {
  __shared__ block_storage storage;
  for (int k = static_cast<int>(blockIdx.x); k < t.size(); k += static_cast<int>(gridDim.x)) {
    const matrix_desc& a = t[k];
    V* pa = p + a.p_offset;
    for (std::size_t c = 0; c < a.rank; ++c) {
      V* pc = pa + c * a.rows;
      for (int pass = 0; pass < 2; ++pass)
        for (std::size_t b = 0; b < c; ++b) {
          const V* pb = pa + b * a.rows;
          double dot = 0;
          for (std::size_t i = threadIdx.x; i < a.rows; i += block_threads)
            dot += static_cast<double>(pc[i]) * static_cast<double>(pb[i]);
          const auto d = static_cast<V>(block_sum(dot, storage));
          for (std::size_t i = threadIdx.x; i < a.rows; i += block_threads) pc[i] -= d * pb[i];
        }
      double norm = 0;
      for (std::size_t i = threadIdx.x; i < a.rows; i += block_threads)
        norm += static_cast<double>(pc[i]) * static_cast<double>(pc[i]);
      norm = sqrt(block_sum(norm, storage));  // IEEE sqrt and division, as the host's: the same inverse
      const V inverse = norm > 0 ? static_cast<V>(1 / norm) : V(0);
      for (std::size_t i = threadIdx.x; i < a.rows; i += block_threads) pc[i] *= inverse;
    }
  }
}

// out = P Q^T (or minuend - P Q^T) over each matrix's `count` elements: a thread per element,
// the r products summed in double and rounded once.
template <class V, class Table>
__global__ void __launch_bounds__(block_threads)
    reconstruct_kernel(Table t, const V* p, const V* q, V* out, const V* minuend, std::size_t elements) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * block_threads;
  for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * block_threads + threadIdx.x; e < elements; e += stride) {
    const matrix_desc& a = t[locate(t, e, by_element)];
    const std::size_t local = e - a.begin[by_element], i = local / a.cols, j = local % a.cols;
    double sum = 0;
    for (std::size_t c = 0; c < a.rank; ++c)
      sum += static_cast<double>(p[a.p_offset + c * a.rows + i]) * static_cast<double>(q[a.q_offset + c * a.cols + j]);
    const std::size_t at = a.offset + local;
    out[at] = static_cast<V>(minuend ? static_cast<double>(minuend[at]) - sum : sum);
  }
}

// The host's splitmix64 value for Q's element c cols + j: integer arithmetic, then a 53-bit
// integer times 2^-52 (exact) minus 1 (exact, so a fused multiply-add gives the same bits).
__device__ __forceinline__ double seed_value(std::uint64_t seed, std::size_t place) {
  std::uint64_t z = seed + 0x9E37'79B9'7F4A'7C15ull * (place + 1);
  z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-52 - 1.0;
}

// A block per column of Q: left alone if any element is nonzero, else filled. Matrix k's seed
// is seed + seed_step k.
template <class V, class Table>
__global__ void __launch_bounds__(block_threads)
    seed_empty_columns_kernel(Table t, V* q, std::uint64_t seed, std::uint64_t seed_step, std::size_t columns) {
  for (std::size_t u = blockIdx.x; u < columns; u += gridDim.x) {
    const int k = locate(t, u, by_column);
    const matrix_desc& a = t[k];
    const std::size_t c = u - a.begin[by_column];
    V* qc = q + a.q_offset + c * a.cols;
    int nonzero = 0;
    for (std::size_t j = threadIdx.x; j < a.cols; j += block_threads) nonzero |= qc[j] != V(0);
    if (__syncthreads_or(nonzero)) continue;  // the same answer in every thread
    const std::uint64_t s = seed + seed_step * static_cast<std::uint64_t>(k);
    for (std::size_t j = threadIdx.x; j < a.cols; j += block_threads)
      qc[j] = static_cast<V>(seed_value(s, c * a.cols + j));
  }
}

// --- dispatch ----------------------------------------------------------------------------
// Enough blocks to fill every SM several times over, no more: the grid-stride loops do the rest.
inline unsigned grid_for(std::size_t blocks) {
  const std::size_t most =
      static_cast<std::size_t>(gradwire::cuda::multiprocessor_count(gradwire::cuda::current_device())) * 8;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(blocks, most)));
}

template <class V>
void check_element() {
  static_assert(is_low_rank_element_v<V>, "compress::low_rank::cuda: V must be float or double (as the host codec's)");
}

template <class V, class Table>
void launch_multiply(const Table& t, std::size_t rows, const V* m, const V* q, V* p, cudaStream_t stream) {
  check_element<V>();
  if (rows == 0) return;
  multiply_kernel<V><<<grid_for((rows + warps_per_block - 1) / warps_per_block), block_threads, 0, stream>>>(t, m, q, p,
                                                                                                            rows);
  gradwire::cuda::check(cudaGetLastError(), "compress::low_rank::cuda::multiply");
}
template <class V, class Table>
void launch_multiply_transposed(const Table& t, std::size_t tiles, const V* m, const V* p, V* q, cudaStream_t stream) {
  check_element<V>();
  if (tiles == 0) return;
  multiply_transposed_kernel<V><<<grid_for(tiles), block_threads, 0, stream>>>(t, m, p, q, tiles);
  gradwire::cuda::check(cudaGetLastError(), "compress::low_rank::cuda::multiply_transposed");
}
template <class V, class Table>
void launch_orthogonalise(const Table& t, int matrices, V* p, cudaStream_t stream) {
  check_element<V>();
  if (matrices == 0) return;
  orthogonalise_kernel<V><<<grid_for(static_cast<std::size_t>(matrices)), block_threads, 0, stream>>>(t, p);
  gradwire::cuda::check(cudaGetLastError(), "compress::low_rank::cuda::orthogonalise");
}
template <class V, class Table>
void launch_reconstruct(const Table& t, std::size_t elements, const V* p, const V* q, V* out, const V* minuend,
                        cudaStream_t stream) {
  check_element<V>();
  if (elements == 0) return;
  reconstruct_kernel<V><<<grid_for((elements + block_threads - 1) / block_threads), block_threads, 0, stream>>>(
      t, p, q, out, minuend, elements);
  gradwire::cuda::check(cudaGetLastError(), "compress::low_rank::cuda::reconstruct");
}
template <class V, class Table>
void launch_seed(const Table& t, std::size_t columns, V* q, std::uint64_t seed, std::uint64_t seed_step,
                 cudaStream_t stream) {
  check_element<V>();
  if (columns == 0) return;
  seed_empty_columns_kernel<V><<<grid_for(columns), block_threads, 0, stream>>>(t, q, seed, seed_step, columns);
  gradwire::cuda::check(cudaGetLastError(), "compress::low_rank::cuda::seed_empty_columns");
}

// A table of one: every kind of work starts at 0 (describe leaves begin zero).
inline one_matrix single(const matrix_shape& s, std::size_t count) noexcept { return {describe(s, count)}; }

}  // namespace detail

// --- one matrix: pointers to its M, P (rows x r) and Q (cols x r) ------------------------

// P = M Q (M: rows cols elements, the padding zero).
template <class V>
void multiply(const V* m, const V* q, V* p, const matrix_shape& s, cudaStream_t stream) {
  detail::launch_multiply(detail::single(s, s.rows * s.cols), s.rank ? s.rows : 0, m, q, p, stream);
}

// Q = M^T P.
template <class V>
void multiply_transposed(const V* m, const V* p, V* q, const matrix_shape& s, cudaStream_t stream) {
  const auto t = detail::single(s, s.rows * s.cols);
  detail::launch_multiply_transposed(t, s.rank ? detail::units(t.a, detail::by_tile) : 0, m, p, q, stream);
}

// P's columns orthonormal in place, in order; a column left with length 0 stays 0.
template <class V>
void orthogonalise(V* p, const matrix_shape& s, cudaStream_t stream) {
  detail::launch_orthogonalise(detail::single(s, s.rows * s.cols), s.rank ? 1 : 0, p, stream);
}

// out[0, n) = the first n elements of P Q^T, row-major (n <= rows cols); with `minuend`,
// out = minuend - P Q^T (minuend indexed as out; it may be out).
template <class V>
void reconstruct(const V* p, const V* q, V* out, std::size_t n, const matrix_shape& s, cudaStream_t stream,
                 const V* minuend = nullptr) {
  detail::launch_reconstruct(detail::single(s, n), s.rank ? n : 0, p, q, out, minuend, stream);
}

// Q's all-zero columns filled from `seed`, the same values as the host's seed_empty_columns.
template <class V>
void seed_empty_columns(V* q, const matrix_shape& s, std::uint64_t seed, cudaStream_t stream) {
  detail::launch_seed(detail::single(s, s.rows * s.cols), s.rank, q, seed, std::uint64_t{0}, stream);
}

// --- every matrix of a bucket's plan, one launch per operation ---------------------------

// A buffer_plan's matrices in device memory (their offsets and where each kernel's work for
// them starts), uploaded once on `stream` (waited for: any stream may then use the plan) and
// freed there: destroy it only after the work queued with it on other streams has finished. Pointers passed with it are the
// bases of the plan's buffers: M (m_size elements), P (the first round, p_size), Q (the
// second, q_size), out and minuend (n): each matrix is at its own offsets in them, as
// compress::powersgd's m_of, p_of and q_of. Plain stretches are not touched.
class device_plan {
 public:
  device_plan(const buffer_plan& plan, cudaStream_t stream) : table_(stream) {
    std::vector<detail::matrix_desc> table;
    table.reserve(plan.matrices.size());
    for (const auto& a : plan.matrices)
      table.push_back(detail::describe(a.shape, a.count, a.offset, a.p_offset, a.q_offset));
    totals_ = detail::number(table);
    matrices_ = static_cast<int>(table.size());
    if (table.empty()) return;
    table_.reserve_discard(table.size());
    device_table_ = table_.data();
    // Pageable source: the call returns once it is staged, so `table` may go.
    gradwire::cuda::check(cudaMemcpyAsync(table_.data(), table.data(), table.size() * sizeof(detail::matrix_desc),
                                          cudaMemcpyHostToDevice, stream),
                          "compress::low_rank::cuda::device_plan: upload");
    // Once, at setup: the table is in place before any stream's kernel reads it (a launch on
    // another stream is not ordered after this one's upload).
    gradwire::cuda::check(cudaStreamSynchronize(stream), "compress::low_rank::cuda::device_plan: upload");
  }

  int matrices() const noexcept { return matrices_; }
  std::size_t units(detail::unit kind) const noexcept { return totals_.of[kind]; }
  detail::matrix_table table() const noexcept { return {device_table_, matrices_}; }

 private:
  gradwire::cuda::device_buffer<detail::matrix_desc> table_;
  const detail::matrix_desc* device_table_ = nullptr;
  detail::totals totals_;
  int matrices_ = 0;
};

template <class V>
void multiply(const device_plan& plan, const V* m, const V* q, V* p, cudaStream_t stream) {
  detail::launch_multiply(plan.table(), plan.units(detail::by_row), m, q, p, stream);
}
template <class V>
void multiply_transposed(const device_plan& plan, const V* m, const V* p, V* q, cudaStream_t stream) {
  detail::launch_multiply_transposed(plan.table(), plan.units(detail::by_tile), m, p, q, stream);
}
// Every matrix's P at once: a block per matrix ("once per bucket").
template <class V>
void orthogonalise(const device_plan& plan, V* p, cudaStream_t stream) {
  detail::launch_orthogonalise(plan.table(), plan.matrices(), p, stream);
}
// out[a.offset ..] = P Q^T for each matrix a (count elements); with `minuend` (indexed as out),
// minuend - P Q^T: powersgd's keep_residual with minuend = M.
template <class V>
void reconstruct(const device_plan& plan, const V* p, const V* q, V* out, cudaStream_t stream,
                 const V* minuend = nullptr) {
  detail::launch_reconstruct(plan.table(), plan.units(detail::by_element), p, q, out, minuend, stream);
}
// Matrix k seeded with seed + seed_step k (powersgd's seed_of: options.seed and 0xD1B5'4A32'D192'ED03).
template <class V>
void seed_empty_columns(const device_plan& plan, V* q, std::uint64_t seed, std::uint64_t seed_step,
                        cudaStream_t stream) {
  detail::launch_seed(plan.table(), plan.units(detail::by_column), q, seed, seed_step, stream);
}

}  // namespace gradwire::compress::low_rank::cuda
