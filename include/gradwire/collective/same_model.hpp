// check_same_model: at a strategy's construction, every rank learns whether all ranks built the same model.
//
// A rank that builds its strategy with other shapes (1000 elements where the others have
// 1001, one tensor more, doubles instead of floats) would otherwise fail later and
// worse: a size mismatch inside some collective at the first step, a parameter server
// that waits for a shard nobody sends, or, where the element counts happen to agree
// (a [2, 3] beside a [3, 2]), silently mixed-up gradients. So the strategy first
// all-gathers a fixed-size digest of each rank's layout (dtype, tensor count, total
// elements, a hash of every shape): one small collective, the same on every rank. Every
// rank then holds every digest, so every rank reaches the same verdict and throws the
// same errc::mismatch; nobody waits for anybody (no hang). Only when the digests differ
// do the ranks gather their full shape lists (a second collective, sized by the largest
// list, which every rank knows from the digests), to name the first difference.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/dtype.hpp"
#include "../tensor/shape.hpp"
#include "all_gather.hpp"
#include "communicator.hpp"

namespace gradwire::collective {

namespace detail {
// A model's layout as numbers (all exact in a double: extents and counts stay far below
// 2^53): dtype, tensor count, then per tensor its rank and extents.
inline std::vector<double> layout_words(dtype type, std::span<const shape> shapes) {
  std::vector<double> words{static_cast<double>(type), static_cast<double>(shapes.size())};
  for (const auto& s : shapes) {
    words.push_back(static_cast<double>(s.rank()));
    for (auto e : s.extents()) words.push_back(static_cast<double>(e));
  }
  return words;
}

// digest: word count, dtype, tensor count, total elements, and a 64-bit FNV-1a hash of
// the words in two exact 32-bit halves.
inline constexpr std::size_t digest_words = 6;
inline std::array<double, digest_words> layout_digest(std::span<const double> words, std::span<const shape> shapes) {
  std::uint64_t h = 1469598103934665603ull, total = 0;
  for (double w : words) {
    h ^= static_cast<std::uint64_t>(w);
    h *= 1099511628211ull;
  }
  for (const auto& s : shapes) total += s.elements();
  return {static_cast<double>(words.size()), words[0], words[1], static_cast<double>(total),
          static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
}

struct decoded_layout {
  dtype type{};
  std::vector<shape> shapes;
  std::size_t elements = 0;
};
inline decoded_layout decode_layout(std::span<const double> words) {
  decoded_layout out;
  out.type = static_cast<dtype>(static_cast<int>(words[0]));
  const auto count = static_cast<std::size_t>(words[1]);
  std::size_t at = 2;
  for (std::size_t i = 0; i < count && at < words.size(); ++i) {
    const auto rank = static_cast<std::size_t>(words[at++]);
    std::vector<std::size_t> extents;
    for (std::size_t k = 0; k < rank && at < words.size(); ++k) extents.push_back(static_cast<std::size_t>(words[at++]));
    out.shapes.emplace_back(extents);
    out.elements += out.shapes.back().elements();
  }
  return out;
}

// "2 tensors of f32, 1100 elements: [1000], [10, 10]" (the first 8 shapes).
GRADWIRE_DECL std::string describe_layout(const decoded_layout& m);

GRADWIRE_DECL std::string first_difference(const decoded_layout& a, int rank_a, const decoded_layout& b, int rank_b);
}  // namespace detail

// Collective (every rank, same point, before any other collective of the strategy):
// throws errc::mismatch on every rank unless every rank passed the same dtype and shapes,
// naming rank 0's model, the first rank's that differs, and the first difference.
template <class Tr>
void check_same_model(communicator<Tr>& comm, dtype type, std::span<const shape> shapes) {
  const int n = comm.size(), me = comm.rank();
  if (n == 1) return;
  const std::vector<double> words = detail::layout_words(type, shapes);
  const auto digest = detail::layout_digest(words, shapes);
  constexpr std::size_t k = detail::digest_words;
  std::vector<double> digests(k * static_cast<std::size_t>(n));
  all_gather(comm, std::span<const double>(digest), std::span<double>(digests));
  std::vector<int> differ;
  std::size_t longest = 0;
  for (int r = 0; r < n; ++r) {
    const std::span<const double> d(digests.data() + k * static_cast<std::size_t>(r), k);
    if (!std::equal(d.begin(), d.end(), digests.begin())) differ.push_back(r);
    longest = std::max(longest, static_cast<std::size_t>(d[0]));
  }
  if (differ.empty()) return;
  // Every rank takes this branch (they all hold the same digests): gather the full lists.
  std::vector<double> mine(longest, 0.0), all(longest * static_cast<std::size_t>(n));
  std::copy(words.begin(), words.end(), mine.begin());
  all_gather(comm, std::span<const double>(mine), std::span<double>(all));
  auto layout_of = [&](int r) {
    return detail::decode_layout(std::span<const double>(all.data() + longest * static_cast<std::size_t>(r), longest));
  };
  const auto zero = layout_of(0), other = layout_of(differ[0]);
  std::string which;
  for (std::size_t i = 0; i < differ.size() && i < 8; ++i) which += (i ? ", " : "") + std::to_string(differ[i]);
  if (differ.size() > 8) which += ", ...";
  const std::string what =
      "strategy on rank " + std::to_string(me) + ": the ranks built different models: rank 0 has " +
      detail::describe_layout(zero) + "; rank " + std::to_string(differ[0]) + " has " +
      detail::describe_layout(other) + " (first difference: " +
      detail::first_difference(zero, 0, other, differ[0]) + "; rank" + (differ.size() > 1 ? "s " : " ") +
      which + (differ.size() > 1 ? " differ" : " differs") +
      " from rank 0). Build the same model (same tensors, shapes, order and dtype) on every rank";
  // A rank that finishes the gather first and fails would otherwise abort a peer still
  // receiving its part as a bare lost peer (seen over TCP): the abort carries the
  // mismatch and this report instead.
  if constexpr (concepts::failable_transport<Tr>) comm.transport().fail(errc::mismatch, what);
  throw error(errc::mismatch, what);
}

}  // namespace gradwire::collective

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "same_model.ipp"
#endif
