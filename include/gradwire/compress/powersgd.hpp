// compress::powersgd: a buffer sent as two thin factors of a rank-r approximation (Vogels et al. 2019, PowerSGD).
//
// Why/maths: a bucket of n elements is read as a matrix M (compress::low_rank::matrix_shape:
// near-square, cols = ceil(sqrt n), zero-padded), with this rank's residual added
// (error feedback). One step of subspace (power) iteration, warm-started from the previous
// step's Q:
//     P = M Q;  all-reduce P (sum);  orthogonalise P (Gram-Schmidt, once per bucket);
//     Q = M^T P;  all-reduce Q (sum);  M' = P Q^T, the approximation of sum_ranks M
// and the residual kept is M - P Q_local^T (Q before its all-reduce): what this rank's M lost
// in the projection on P. P is orthonormal and the same on every rank, so the sum of the
// ranks' projections is P (sum Q)^T: the approximation is linear in the ranks' M although
// the codec is not, which is why it is reduced as factors (concepts::compression_kind::
// low_rank) and not through a ring of encodes. Q stays from step to step (warm start), the
// same on every rank (it was all-reduced), so one power iteration per step tracks the top
// subspace of the slowly changing gradients.
// Costs: r (rows + cols), about 2 r sqrt(n) elements on the wire for n: 1/250 of a 25 MiB
// float bucket at r = 4; compute 3 r n multiply-adds for the products and 2 r n more for the
// residual; memory per bucket 2 n elements (M and the residual) plus the factors. With rank
// >= rows the approximation is exact up to rounding (a cost with no saving: r (rows + cols)
// >= n). Before `start_step` the rounds send M whole and plain (error feedback off: the
// residual is zero when compression starts), as PyTorch's start_powerSGD_iter: early
// gradients change fast and compressing them hurts accuracy most.
// A single encode (a parameter-server push, where nothing is summed before decode) runs the
// same maths on this rank's M alone and sends P and Q; it compresses from the first step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

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

  // Everything a buffer keeps, allocated at init: M (with the residual added), the residual,
  // P, Q (the warm start), and the step count.
  template <class V>
  struct state {
    std::size_t n = 0;
    low_rank::matrix_shape shape;
    std::uint64_t step = 0;
    bool plain = false;  // this step's rounds send M whole
    aligned_buffer<V> m, residual, p, q;
  };
  template <class V>
  state<V> init(std::size_t n) const {
    state<V> s;
    s.n = n;
    s.shape = shape(n);
    s.m = aligned_buffer<V>(s.shape.rows * s.shape.cols);
    s.residual = aligned_buffer<V>(n);
    s.p = aligned_buffer<V>(s.shape.p_size());
    s.q = aligned_buffer<V>(s.shape.q_size());
    low_rank::seed_empty_columns(s.q.span(), s.shape, options_.seed);
    return s;
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
    low_rank::seed_empty_columns(s.q.span(), s.shape, options_.seed);
    low_rank::multiply<V>(s.m.span(), s.q.span(), s.p.span(), s.shape);
    return s.p.span();
  }
  template <class V>
  std::span<V> low_rank_middle(state<V>& s) const {
    if (s.plain) return {};
    low_rank::orthogonalise(s.p.span(), s.shape);
    low_rank::multiply_transposed<V>(s.m.span(), s.p.span(), s.q.span(), s.shape);
    keep_residual(s);
    return s.q.span();
  }
  template <class V>
  void low_rank_end(state<V>& s, std::span<V> out) const {
    detail::check_state(name, s.n, out.size());
    if (s.plain)
      std::copy(s.m.data(), s.m.data() + s.n, out.begin());
    else
      low_rank::reconstruct<V>(s.p.span(), s.q.span(), out, s.shape);
    ++s.step;
  }

  // --- a single encode (no sum between encode and decode) ---
  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    detail::check_state(name, s.n, in.size());
    detail::check_payload(name, out.size(), encoded_bytes<V>(s.n), s.n);
    kernels::add(s.m.data(), in.data(), s.residual.data(), s.n);
    low_rank::seed_empty_columns(s.q.span(), s.shape, options_.seed);
    low_rank::multiply<V>(s.m.span(), s.q.span(), s.p.span(), s.shape);
    low_rank::orthogonalise(s.p.span(), s.shape);
    low_rank::multiply_transposed<V>(s.m.span(), s.p.span(), s.q.span(), s.shape);
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
  // residual = M - P Q^T (this rank's Q), over the buffer's n elements.
  template <class V>
  static void keep_residual(state<V>& s) {
    low_rank::reconstruct<V>(s.p.span(), s.q.span(), s.residual.span(), s.shape, s.m.data());
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
