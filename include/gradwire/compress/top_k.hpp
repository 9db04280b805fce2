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
// traffic grows with N where a ring's does not. Selection is a radix select on the
// magnitudes' bits (a histogram pass over the buffer, then the few elements of the bin that
// holds the k-th largest) with an index array kept in the state: O(n), no allocation.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "detail/narrow_float.hpp"
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
    using U = typename detail::wide_float<V>::bits;
    const V* x = in.data();
    std::uint32_t* order = s.order.data();
    // The k-th largest key, digit by digit from the top (a radix select): a histogram of the
    // top digit over the whole buffer finds the digit's bin that holds it; the indices from
    // that bin up (about k of them, in ascending order) are kept aside, and each next digit
    // is found among them alone.
    constexpr int key_bits = 8 * sizeof(U) - 1;
    int shift = key_bits - radix_bits;
    std::uint32_t count[std::size_t{1} << radix_bits] = {};
    for (std::size_t i = 0; i < n; ++i) ++count[key(x[i]) >> shift];
    std::size_t above = 0;  // elements whose key is above the digits found so far
    U prefix = boundary(count, std::size_t{1} << radix_bits, kept, above);
    std::size_t candidates = 0;
    for (std::size_t i = 0; i < n; ++i) {  // branch-free: the kept ones are few and anywhere
      order[candidates] = static_cast<std::uint32_t>(i);
      candidates += (key(x[i]) >> shift) >= prefix;
    }
    while (shift > 0) {
      const int next = shift > radix_bits ? shift - radix_bits : 0;
      const std::size_t bins = std::size_t{1} << (shift - next);
      std::fill(count, count + bins, 0u);
      for (std::size_t j = 0; j < candidates; ++j) {
        const U key_j = key(x[order[j]]);
        if ((key_j >> shift) == prefix) ++count[(key_j >> next) & (bins - 1)];
      }
      prefix = (prefix << (shift - next)) | boundary(count, bins, kept, above);
      shift = next;
    }
    // prefix is the k-th largest key, `above` elements are larger: those are kept, and of the
    // ones equal to it the first kept - above by index.
    std::size_t equal = kept - above, j = 0;
    std::byte* indices = out.data();
    std::byte* values = out.data() + kept * sizeof(std::uint32_t);
    for (std::size_t c = 0; c < candidates; ++c) {
      const std::uint32_t i = order[c];
      const U key_i = key(x[i]);
      if (key_i > prefix || (key_i == prefix && equal > 0)) {
        equal -= key_i == prefix;
        detail::store<std::uint32_t>(indices + j * sizeof(std::uint32_t), i);
        detail::store<V>(values + j * sizeof(V), x[i]);
        ++j;
      }
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
  static constexpr int radix_bits = 11;  // 2048 bins: 8 KiB of counts, in L1

  // |x|'s bits: their integer order is the order by magnitude; NaN reads as infinity (the
  // largest, tied with it and broken by index like any other tie).
  template <class V>
  static auto key(V x) noexcept {
    using U = typename detail::wide_float<V>::bits;
    constexpr U infinity = std::bit_cast<U>(std::numeric_limits<V>::infinity());
    return std::min<U>(std::bit_cast<U>(x) & (~U{0} >> 1), infinity);
  }
  // The bin, from the top, in which the kept-th largest falls; `above` grows by the counts
  // of the bins over it.
  static std::uint32_t boundary(const std::uint32_t* count, std::size_t bins, std::size_t kept, std::size_t& above) noexcept {
    std::size_t bin = bins - 1;
    while (above + count[bin] < kept) above += count[bin--];
    return static_cast<std::uint32_t>(bin);
  }

  double fraction_;
};

static_assert(concepts::compressor<top_k, float> && concepts::compressor<top_k, double>);

}  // namespace gradwire::compress
