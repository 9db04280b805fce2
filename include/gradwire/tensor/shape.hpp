// A tensor's shape: its extents and element count.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

namespace gradwire {

class shape {
 public:
  shape() = default;
  shape(std::initializer_list<std::size_t> extents) : extents_(extents) {}
  explicit shape(std::vector<std::size_t> extents) : extents_(std::move(extents)) {}

  std::size_t rank() const noexcept { return extents_.size(); }
  std::size_t operator[](std::size_t i) const { return extents_.at(i); }
  const std::vector<std::size_t>& extents() const noexcept { return extents_; }

  // Product of the extents; a rank-0 shape holds one element (a scalar).
  std::size_t elements() const noexcept {
    return std::accumulate(extents_.begin(), extents_.end(), std::size_t{1}, std::multiplies<>{});
  }

  std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < extents_.size(); ++i) s += (i ? ", " : "") + std::to_string(extents_[i]);
    return s + "]";
  }

  friend bool operator==(const shape&, const shape&) = default;

 private:
  std::vector<std::size_t> extents_;
};

}  // namespace gradwire
