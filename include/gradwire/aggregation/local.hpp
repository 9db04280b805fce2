// One replica, no communication: the update is applied where the gradients are (one_device).
#pragma once

#include <cstddef>
#include <span>

#include "../collective/communicator.hpp"

namespace gradwire::aggregation {

struct local {
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  template <class Tr, class V>
  void setup(collective::communicator<Tr>&, std::span<const std::span<V>>) {}

  template <class Tr, class V, class Apply>
  void step(collective::communicator<Tr>&, std::span<const std::span<V>>, std::span<const std::span<const V>> grads,
            Apply&& apply) {
    for (std::size_t i = 0; i < grads.size(); ++i) apply(i, grads[i], V(1));
  }
};

}  // namespace gradwire::aggregation
