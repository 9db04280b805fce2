// A tensor's shape: its extents and element count, stored inline (no allocation).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"

namespace gradwire {

class shape {
 public:
  static constexpr std::size_t max_rank = 8;

  // Rank 0: a scalar, one element (as in NumPy). An empty tensor is shape{0}.
  constexpr shape() noexcept = default;
  shape(std::initializer_list<std::size_t> extents) { assign(extents.begin(), extents.end()); }
  explicit shape(std::span<const std::size_t> extents) { assign(extents.begin(), extents.end()); }
  explicit shape(const std::vector<std::size_t>& extents) { assign(extents.begin(), extents.end()); }

  std::size_t rank() const noexcept { return rank_; }
  std::size_t operator[](std::size_t i) const {
    if (i >= rank_) throw error(errc::invalid_argument, "shape: axis " + std::to_string(i) + " of " + to_string());
    return extents_[i];
  }
  std::span<const std::size_t> extents() const noexcept { return {extents_.data(), rank_}; }

  std::size_t elements() const noexcept {
    return std::accumulate(extents_.begin(), extents_.begin() + rank_, std::size_t{1}, std::multiplies<>{});
  }

  std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(extents_[i]);
    return s + "]";
  }

  friend bool operator==(const shape& a, const shape& b) noexcept {
    return a.rank_ == b.rank_ && std::equal(a.extents_.begin(), a.extents_.begin() + a.rank_, b.extents_.begin());
  }

 private:
  template <class It>
  void assign(It first, It last) {
    const auto n = static_cast<std::size_t>(std::distance(first, last));
    if (n > max_rank)
      throw error(errc::invalid_argument,
                  "shape: rank " + std::to_string(n) + " exceeds gradwire::shape::max_rank = " + std::to_string(max_rank));
    std::copy(first, last, extents_.begin());
    rank_ = n;
  }

  std::array<std::size_t, max_rank> extents_{};
  std::size_t rank_ = 0;
};

}  // namespace gradwire
