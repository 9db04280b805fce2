// flat_layout: a list of tensors placed back to back in one flat buffer (offsets, slices, gather, scatter).
//
// The one pack/unpack of the library: buckets, central storage's flat model, a
// strategy's accumulated gradients and the optimizer state an averaging step reduces all
// place tensors this way. The order may differ from the tensors' own (buckets follow the
// order backward produces gradients), so tensor i's slice is found through offset(i).
#pragma once

#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"

namespace gradwire {

class flat_layout {
 public:
  flat_layout() = default;

  // Tensors of sizes[i] elements, placed in index order.
  explicit flat_layout(std::span<const std::size_t> sizes) {
    std::vector<std::size_t> order(sizes.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    assign(sizes, order);
  }
  // Tensors placed in `order` (a permutation of 0..sizes.size()-1): order[0] first.
  flat_layout(std::span<const std::size_t> sizes, std::span<const std::size_t> order) { assign(sizes, order); }

  // The layout of a list of tensors (anything with size()), in index order.
  template <class Tensors>
  static flat_layout of(const Tensors& tensors) {
    std::vector<std::size_t> sizes;
    for (const auto& t : tensors) sizes.push_back(t.size());
    return flat_layout(sizes);
  }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::size_t total() const noexcept { return total_; }  // elements
  std::size_t size(std::size_t i) const noexcept { return sizes_[i]; }
  std::size_t offset(std::size_t i) const noexcept { return offsets_[i]; }
  // The tensors in flat order, and where each one sits in it.
  std::span<const std::size_t> order() const noexcept { return order_; }
  std::size_t position(std::size_t i) const noexcept { return positions_[i]; }

  // Whether `tensors` have exactly the sizes this layout was made for.
  template <class Tensors>
  bool fits(const Tensors& tensors) const noexcept {
    if (std::size(tensors) != sizes_.size()) return false;
    std::size_t i = 0;
    for (const auto& t : tensors)
      if (t.size() != sizes_[i++]) return false;
    return true;
  }

  // Tensor i's slice of `flat` (which holds total() elements or more).
  template <class V>
  std::span<V> slice(std::span<V> flat, std::size_t i) const noexcept {
    return flat.subspan(offsets_[i], sizes_[i]);
  }

  // Copies tensors[i] into its slice, for every i (or for the tensors at flat positions
  // [first, last) only).
  template <class V, class Tensors>
  void gather(const Tensors& tensors, std::span<V> flat) const {
    gather(tensors, flat, 0, order_.size());
  }
  template <class V, class Tensors>
  void gather(const Tensors& tensors, std::span<V> flat, std::size_t first, std::size_t last) const {
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t i = order_[k];
      if (sizes_[i]) std::memcpy(flat.data() + offsets_[i], std::data(tensors[i]), sizes_[i] * sizeof(V));
    }
  }

  // Copies each slice back into tensors[i] (or for flat positions [first, last) only).
  template <class V, class Tensors>
  void scatter(std::span<const V> flat, const Tensors& tensors) const {
    scatter(flat, tensors, 0, order_.size());
  }
  template <class V, class Tensors>
  void scatter(std::span<const V> flat, const Tensors& tensors, std::size_t first, std::size_t last) const {
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t i = order_[k];
      if (sizes_[i]) std::memcpy(std::data(tensors[i]), flat.data() + offsets_[i], sizes_[i] * sizeof(V));
    }
  }

 private:
  GRADWIRE_DECL void assign(std::span<const std::size_t> sizes, std::span<const std::size_t> order);

  std::vector<std::size_t> sizes_, order_, offsets_, positions_;
  std::size_t total_ = 0;
};

}  // namespace gradwire

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "flat_layout.ipp"
#endif
