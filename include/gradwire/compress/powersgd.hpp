// compress::powersgd: a buffer sent as two thin factors of a rank-r approximation (Vogels et al. 2019, PowerSGD).
//
// Why/maths: a bucket is read as matrices M (compress::low_rank::buffer_plan): under
// strategy<>, which knows the tensors' shapes, each weight tensor is its own matrix (shape[0]
// rows) and biases and small tensors are sent plain, summed in the first round; without
// shapes, the whole bucket is one near-square matrix (cols = ceil(sqrt n), zero-padded),
// which mixes tensors within its rows and needs a higher rank for the same accuracy. Each M
// has this rank's residual added (error feedback). One step of subspace (power) iteration
// per matrix, warm-started from the previous step's Q:
//     P = M Q;  all-reduce P (sum);  orthogonalise P (Gram-Schmidt, each matrix's);
//     Q = M^T P;  all-reduce Q (sum);  M' = P Q^T, the approximation of sum_ranks M
// and the residual kept is M - P Q_local^T (Q before its all-reduce): what this rank's M lost
// in the projection on P. P is orthonormal and the same on every rank, so the sum of the
// ranks' projections is P (sum Q)^T: the approximation is linear in the ranks' M although
// the codec is not, which is why it is reduced as factors (concepts::compression_kind::
// low_rank) and not through a ring of encodes. Q stays from step to step (warm start), the
// same on every rank (it was all-reduced), so one power iteration per step tracks the top
// subspace of the slowly changing gradients.
// Costs: r (rows + cols) per matrix, about 2 r sqrt(n) elements on the wire for a near-square
// n: 1/250 of a 25 MiB float bucket at r = 4 (a tensor's own matrix: r (rows + cols)); compute 3 r n multiply-adds for the products and 2 r n more for the
// residual; memory per bucket 2 n elements (M and the residual) plus the factors. With rank
// >= rows the approximation is exact up to rounding (a cost with no saving: r (rows + cols)
// >= n). Before `start_step` the rounds send M whole and plain (error feedback off: the
// residual is zero when compression starts), as PyTorch's start_powerSGD_iter: early
// gradients change fast and compressing them hurts accuracy most.
// A single encode (a parameter-server push, where nothing is summed before decode) runs the
// same maths on this rank's near-square M alone and sends P and Q, so that the payload
// decodes from its size alone; it compresses from the first step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "detail/payload.hpp"
#include "low_rank.hpp"

namespace gradwire::compress {

struct powersgd_options {
  // r, at least 1 (min(r, rows) is used). PyTorch's default is 1; Vogels et al. train
  // ResNet-18 on CIFAR-10 to full accuracy with 2.
  int rank = 1;
  // The rounds send plain sums for the steps before this one (counted per buffer from 0).
  std::uint64_t start_step = 1000;
  // Q's first values (and a column emptied by a zero gradient): the same on every rank.
  std::uint64_t seed = 0x5EED'0F'90E5'5D00ull;
  // Planned from tensor shapes (init<V>(span<const shape>)): a tensor is a matrix of its own
  // only where its elements are at least this many times its factors' r (rows + cols); else
  // it is sent plain (PyTorch's PowerSGDState.min_compression_rate, the same default).
  double min_compression_rate = low_rank::default_min_compression_rate;
};

class powersgd {
 public:
  static constexpr concepts::compression_kind kind = concepts::compression_kind::low_rank;
  static constexpr const char* name = "powersgd";

  // Refuses a rank below 1 (errc::invalid_argument).
  explicit powersgd(powersgd_options options = {}) : options_(options) {
    if (options.rank < 1)
      throw error(errc::invalid_argument, "gradwire::compress::powersgd: rank " + std::to_string(options.rank) +
                                              " is below 1; pass the rank of the approximation, 1 to 4 in "
                                              "the paper's experiments (higher is closer and costs more bytes)");
  }
  const powersgd_options& options() const noexcept { return options_; }
  low_rank::matrix_shape shape(std::size_t n) const noexcept {
    return low_rank::matrix_shape::of(n, static_cast<std::size_t>(options_.rank));
  }

  // Everything a buffer keeps, allocated at init: the plan (its matrices and plain
  // stretches), M (with the residual added), the residual, P (then the plain stretches), Q
  // (the warm start), and the step count.
  template <class V>
  struct state {
    std::size_t n = 0;
    low_rank::buffer_plan plan;
    std::uint64_t step = 0;
    bool plain = false;        // this step's rounds send M whole
    bool by_tensor = false;    // planned from the tensors' shapes: no single encode
    aligned_buffer<V> m, residual, p, q;
  };
  // One near-square matrix over the buffer (low_rank::buffer_plan::near_square).
  template <class V>
  state<V> init(std::size_t n) const {
    return make_state<V>(low_rank::buffer_plan::near_square(n, static_cast<std::size_t>(options_.rank)), false);
  }
  // A matrix per tensor of two or more axes, the rest plain (low_rank::buffer_plan::of_tensors):
  // what aggregation::compressed_all_reduce uses under strategy<>, which knows the shapes.
  template <class V>
  state<V> init(std::span<const gradwire::shape> tensors) const {
    return make_state<V>(low_rank::buffer_plan::of_tensors(tensors, static_cast<std::size_t>(options_.rank),
                                                           options_.min_compression_rate),
                         true);
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const noexcept {
    const auto s = shape(n);
    return (s.p_size() + s.q_size()) * sizeof(V);
  }

  // --- the all-reduce's two rounds (concepts::compressor, low_rank) ---
  template <class V>
  std::span<V> low_rank_begin(state<V>& s, std::span<const V> in) const {
    detail::check_state(name, s.n, in.size());
    s.plain = s.step < options_.start_step;
    V* m = s.m.data();
    if (s.plain) {
      std::copy(in.begin(), in.end(), m);
      return s.m.span().first(s.n);
    }
    kernels::add(m, in.data(), s.residual.data(), s.n);
    for (std::size_t k = 0; k < s.plan.matrices.size(); ++k) {
      const auto& a = s.plan.matrices[k];
      low_rank::seed_empty_columns(q_of(s, a), a.shape, seed_of(k));
      low_rank::multiply<V>(m_of(s, a), q_of(s, a), p_of(s, a), a.shape);
    }
    for (const auto& stretch : s.plan.plain)
      std::copy(m + stretch.offset, m + stretch.offset + stretch.count, s.p.data() + stretch.p_offset);
    return s.p.span();
  }
  template <class V>
  std::span<V> low_rank_middle(state<V>& s) const {
    if (s.plain) return {};
    for (const auto& a : s.plan.matrices) {
      low_rank::orthogonalise(p_of(s, a), a.shape);
      low_rank::multiply_transposed<V>(m_of(s, a), p_of(s, a), q_of(s, a), a.shape);
    }
    keep_residual(s);
    return s.q.span();
  }
  template <class V>
  void low_rank_end(state<V>& s, std::span<V> out) const {
    detail::check_state(name, s.n, out.size());
    if (s.plain) {
      std::copy(s.m.data(), s.m.data() + s.n, out.begin());
    } else {
      for (const auto& a : s.plan.matrices)
        low_rank::reconstruct<V>(p_of(s, a), q_of(s, a), out.subspan(a.offset, a.count), a.shape);
      for (const auto& stretch : s.plan.plain)
        std::copy_n(s.p.data() + stretch.p_offset, stretch.count, out.data() + stretch.offset);
    }
    ++s.step;
  }

  // --- a single encode (no sum between encode and decode) ---
  // The payload is P then Q of the buffer's near-square matrix: a state from init<V>(n).
  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    detail::check_state(name, s.n, in.size());
    if (s.by_tensor)
      throw error(errc::invalid_argument,
                  "gradwire::compress::powersgd: a single encode reads its buffer as one near-square matrix, "
                  "so that the payload decodes from its size alone; this state was planned from tensor shapes "
                  "(for the all-reduce's rounds): make it with init<V>(n)");
    detail::check_payload(name, out.size(), encoded_bytes<V>(s.n), s.n);
    kernels::add(s.m.data(), in.data(), s.residual.data(), s.n);
    if (!s.plan.matrices.empty()) {
      const auto& a = s.plan.matrices.front();
      low_rank::seed_empty_columns(q_of(s, a), a.shape, seed_of(0));
      low_rank::multiply<V>(m_of(s, a), q_of(s, a), p_of(s, a), a.shape);
      low_rank::orthogonalise(p_of(s, a), a.shape);
      low_rank::multiply_transposed<V>(m_of(s, a), p_of(s, a), q_of(s, a), a.shape);
    }
    keep_residual(s);
    if (!out.empty()) {
      std::memcpy(out.data(), s.p.data(), s.p.size() * sizeof(V));
      std::memcpy(out.data() + s.p.size() * sizeof(V), s.q.data(), s.q.size() * sizeof(V));
    }
    ++s.step;
  }
  // out = P Q^T from the payload; the factors are read in place, unaligned, element by element.
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    std::fill(out.begin(), out.end(), V(0));
    decode_add(in, out);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    const std::size_t n = inout.size();
    const auto s = shape(n);
    detail::check_payload(name, in.size(), encoded_bytes<V>(n), n);
    const std::byte* p = in.data();
    const std::byte* q = in.data() + s.p_size() * sizeof(V);
    for (std::size_t i = 0; i < s.rows; ++i) {
      const std::size_t begin = i * s.cols, length = std::min(s.cols, n - std::min(n, begin));
      for (std::size_t c = 0; c < s.rank; ++c)
        add_product(detail::load<V>(p + (c * s.rows + i) * sizeof(V)), q + c * s.cols * sizeof(V),
                    inout.data() + begin, length);
    }
  }

 private:
  template <class V>
  state<V> make_state(low_rank::buffer_plan plan, bool by_tensor) const {
    state<V> s;
    s.n = plan.n;
    s.by_tensor = by_tensor;
    s.m = aligned_buffer<V>(plan.m_size);
    s.residual = aligned_buffer<V>(plan.n);
    s.p = aligned_buffer<V>(plan.p_size);
    s.q = aligned_buffer<V>(plan.q_size);
    s.plan = std::move(plan);
    for (std::size_t k = 0; k < s.plan.matrices.size(); ++k)
      low_rank::seed_empty_columns(q_of(s, s.plan.matrices[k]), s.plan.matrices[k].shape, seed_of(k));
    return s;
  }
  // Matrix k's first Q: a seed of its own, so that equal shapes do not start alike.
  std::uint64_t seed_of(std::size_t k) const noexcept { return options_.seed + 0xD1B5'4A32'D192'ED03ull * k; }
  // A matrix's stretch of M and its factors.
  template <class V>
  static std::span<V> m_of(state<V>& s, const low_rank::buffer_plan::matrix& a) {
    return s.m.span().subspan(a.offset, a.shape.rows * a.shape.cols);
  }
  template <class V>
  static std::span<V> p_of(state<V>& s, const low_rank::buffer_plan::matrix& a) {
    return s.p.span().subspan(a.p_offset, a.shape.p_size());
  }
  template <class V>
  static std::span<V> q_of(state<V>& s, const low_rank::buffer_plan::matrix& a) {
    return s.q.span().subspan(a.q_offset, a.shape.q_size());
  }
  // residual = M - P Q^T (this rank's Q), over each matrix's stretch (the plain ones keep 0).
  template <class V>
  static void keep_residual(state<V>& s) {
    for (const auto& a : s.plan.matrices)
      low_rank::reconstruct<V>(p_of(s, a), q_of(s, a), s.residual.span().subspan(a.offset, a.count), a.shape,
                               s.m.data() + a.offset);
  }
  // out[j] += pic q[j], q read from the payload (unaligned)
  template <class V>
  static void add_product(V pic, const std::byte* GRADWIRE_RESTRICT q, V* GRADWIRE_RESTRICT out, std::size_t n) noexcept {
    GRADWIRE_VECTORIZE
    for (std::size_t j = 0; j < n; ++j) out[j] += pic * detail::load<V>(q + j * sizeof(V));
  }

  powersgd_options options_;
};

static_assert(concepts::compressor<powersgd, float> && concepts::compressor<powersgd, double>);

}  // namespace gradwire::compress
