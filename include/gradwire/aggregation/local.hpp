// One replica, no communication: the update is applied where the gradients are (one_device).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"

namespace gradwire::aggregation {

template <class V, class Tr>
class local_agent {
 public:
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  template <class Policy>
  explicit local_agent(const Policy&) {}

  void setup(collective::communicator<Tr>&, std::span<const std::span<V>> params) { grads_.assign(params.size(), {}); }
  void begin_step(collective::communicator<Tr>&) {}
  void ready(collective::communicator<Tr>&, std::size_t i, std::span<const V> grad) { grads_[i] = grad; }
  template <class Apply>
  void finish_step(collective::communicator<Tr>&, std::span<const std::span<V>>, Apply&& apply) {
    for (std::size_t i = 0; i < grads_.size(); ++i) apply(i, grads_[i], V(1));
  }

 private:
  std::vector<std::span<const V>> grads_;
};

// The policy: nothing to set.
struct local {
  template <class V, class Tr>
  using agent = local_agent<V, Tr>;
};

static_assert(concepts::incremental_aggregation<local, float, concepts::detail::transport_archetype>);
static_assert(concepts::updates_only_through_apply<local_agent<float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
