// Definitions of flat_layout.hpp: compiled once in src/core.cpp, or included by flat_layout.hpp in
// header-only mode (config.hpp).
#pragma once

#include "flat_layout.hpp"

namespace gradwire {

GRADWIRE_DECL void flat_layout::assign(std::span<const std::size_t> sizes, std::span<const std::size_t> order) {
  if (order.size() != sizes.size())
    throw error(errc::invalid_argument, "flat_layout: an order of " + std::to_string(order.size()) + " tensors for " +
                                            std::to_string(sizes.size()));
  sizes_.assign(sizes.begin(), sizes.end());
  order_.assign(order.begin(), order.end());
  offsets_.assign(sizes.size(), 0);
  positions_.assign(sizes.size(), sizes.size());
  total_ = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    if (i >= sizes.size() || positions_[i] != sizes.size())
      throw error(errc::invalid_argument, "flat_layout: the order is not a permutation of 0.." +
                                              std::to_string(sizes.size() - 1) + " (tensor " + std::to_string(i) +
                                              " at position " + std::to_string(k) + ")");
    positions_[i] = k;
    offsets_[i] = total_;
    total_ += sizes[i];
  }
}

}  // namespace gradwire
