// How collectives split a buffer over ranks: rank r's chunk of a reduce_scatter / all_gather.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

namespace gradwire::collective {

namespace detail {
// Chunk i of n elements split over `parts`: the first n % parts chunks get one more.
struct chunking {
  std::size_t n, parts;
  std::size_t begin(std::size_t i) const noexcept { return i * (n / parts) + std::min(i, n % parts); }
  std::size_t length(std::size_t i) const noexcept { return n / parts + (i < n % parts ? 1 : 0); }
};
}  // namespace detail

// Rank `rank`'s chunk of `data` split over `ranks` ranks (empty when data is shorter
// than the rank count and this rank gets nothing): what reduce_scatter leaves reduced
// and what all_gather takes from each rank.
template <class V>
std::span<V> chunk_of(std::span<V> data, int ranks, int rank) noexcept {
  const detail::chunking chunks{data.size(), static_cast<std::size_t>(ranks)};
  return data.subspan(chunks.begin(static_cast<std::size_t>(rank)), chunks.length(static_cast<std::size_t>(rank)));
}

}  // namespace gradwire::collective
