// compress::top_k: the k largest magnitudes of a buffer, sent as (index, value) pairs; the rest read as zero.
//
// Why/maths: k = ceil(fraction n) (at least 1 for a non-empty buffer, at most n); the k
// elements of largest |x| are kept exactly, ties broken towards the lower index so that the
// choice is a function of the values alone (NaN counts as the largest). The payload is k
// 32-bit indices, ascending, then their k values in V: (4 + sizeof(V)) k bytes, so it pays
// below a fraction of about 1/2 (float) and the usual 0.1%..1% sends 0.8%..8% of float's
// bytes. Biased: what is dropped is always the small part, so without error_feedback<top_k>
// the small coordinates never move; with it, they accumulate until they are large enough
// (Stich et al. 2018). Not linear (concepts::compression_kind::gathered): two ranks' top-k
// sets differ, so an all-reduce all-gathers every rank's pairs and adds them, and its
// traffic grows with N where a ring's does not. Selection is std::nth_element over an index
// array kept in the state: O(n) per encode, no allocation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "detail/payload.hpp"

namespace gradwire::compress {

class top_k {
 public:
  static constexpr concepts::compression_kind kind = concepts::compression_kind::gathered;
  static constexpr const char* name = "top_k";

  // fraction: the share of elements kept, in (0, 1]; anything else (0, negative, above 1,
  // NaN) is refused with errc::invalid_argument.
  explicit top_k(double fraction = 0.01) : fraction_(fraction) {
    if (!(fraction > 0 && fraction <= 1))
      throw error(errc::invalid_argument, "gradwire::compress::top_k: fraction " + std::to_string(fraction) +
                                              " is outside (0, 1]; pass the share of elements to keep, e.g. "
                                              "0.01 for the largest 1%");
  }
  double fraction() const noexcept { return fraction_; }

  // How many elements a buffer of n keeps.
  std::size_t k(std::size_t n) const noexcept {
    if (n == 0) return 0;
    const auto wanted = static_cast<std::size_t>(std::ceil(fraction_ * static_cast<double>(n)));
    return std::clamp<std::size_t>(wanted, 1, n);
  }

  // The index array the selection permutes, allocated once.
  template <class V>
  struct state {
    aligned_buffer<std::uint32_t> order;
  };
  template <class V>
  state<V> init(std::size_t n) const {
    if (n > std::numeric_limits<std::uint32_t>::max())
      throw error(errc::invalid_argument, "gradwire::compress::top_k: a buffer of " + std::to_string(n) +
                                              " elements, beyond the 32-bit indices of its payload; use "
                                              "smaller buckets (bucket_bytes)");
    return {aligned_buffer<std::uint32_t>(n)};
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const noexcept {
    return k(n) * (sizeof(std::uint32_t) + sizeof(V));
  }

  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    const std::size_t n = in.size(), kept = k(n);
    detail::check_state(name, s.order.size(), n);
    detail::check_payload(name, out.size(), encoded_bytes<V>(n), n);
    if (n == 0) return;
    std::uint32_t* order = s.order.data();
    std::iota(order, order + n, std::uint32_t{0});
    const auto magnitude = [&](std::uint32_t i) {
      const V m = std::fabs(in[i]);
      return m != m ? std::numeric_limits<V>::infinity() : m;  // NaN: the largest, a strict weak order still
    };
    const auto before = [&](std::uint32_t a, std::uint32_t b) {
      const V ma = magnitude(a), mb = magnitude(b);
      return ma > mb || (ma == mb && a < b);
    };
    if (kept < n) std::nth_element(order, order + (kept - 1), order + n, before);
    std::sort(order, order + kept);
    std::byte* indices = out.data();
    std::byte* values = out.data() + kept * sizeof(std::uint32_t);
    for (std::size_t j = 0; j < kept; ++j) {
      detail::store<std::uint32_t>(indices + j * sizeof(std::uint32_t), order[j]);
      detail::store<V>(values + j * sizeof(V), in[order[j]]);
    }
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    std::fill(out.begin(), out.end(), V(0));
    decode_add(in, out);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    const std::size_t n = inout.size(), kept = k(n);
    detail::check_payload(name, in.size(), encoded_bytes<V>(n), n);
    const std::byte* indices = in.data();
    const std::byte* values = in.data() + kept * sizeof(std::uint32_t);
    for (std::size_t j = 0; j < kept; ++j) {
      const auto i = detail::load<std::uint32_t>(indices + j * sizeof(std::uint32_t));
      if (i >= n)
        throw error(errc::invalid_argument, "gradwire::compress::top_k: a payload names element " +
                                                std::to_string(i) + " of a buffer of " + std::to_string(n) +
                                                "; it was not encoded by top_k for this length (check that every "
                                                "rank uses the same codec, fraction and buckets)");
      inout[i] += detail::load<V>(values + j * sizeof(V));
    }
  }

 private:
  double fraction_;
};

static_assert(concepts::compressor<top_k, float> && concepts::compressor<top_k, double>);

}  // namespace gradwire::compress
