// Central storage (CentralStorageStrategy): one owner rank holds the variables, the others send it gradients.
//
// Every step, all gradients (one flat, reused buffer) are summed onto the owner with
// collective::reduce; only the owner runs the optimizer (grad_scale 1/N, the average
// fused into the step) and then broadcasts the updated parameters (one flat broadcast),
// so every replica holds the owner's bits. Trade-offs:
//   - the owner's link is the bottleneck: 2x the model per step goes through one rank;
//   - the optimizer state that matters exists once (non-owners' states stay untouched),
//     and the owner alone decides the update, so replicas cannot drift apart.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "../collective/broadcast.hpp"
#include "../collective/communicator.hpp"
#include "../collective/reduce.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../transport/local.hpp"

namespace gradwire::aggregation {

class central {
 public:
  // owner: the rank that holds the authoritative variables and applies the optimizer.
  explicit central(int owner = 0) : owner_(owner) {}

  int owner() const noexcept { return owner_; }

  // Replicas start with the owner's parameters; also sizes (and pre-faults) the flat buffer.
  template <class Tr, class V>
  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    check_owner(comm.size());
    auto flat = flat_for<V>(params);
    if (comm.rank() == owner_) pack(flat, params);
    collective::broadcast(comm, flat, owner_);
    if (comm.rank() != owner_) unpack(flat, params);
  }

  template <class Tr, class V, class Apply>
  void step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    const int n = comm.size();
    if (n == 1) {
      for (std::size_t i = 0; i < grads.size(); ++i) apply(i, grads[i], V(1));
      return;
    }
    check_owner(n);
    auto flat = flat_for<V>(grads);
    pack(flat, grads);
    collective::reduce(comm, flat, owner_);
    if (comm.rank() == owner_) {
      // Apply from the summed gradients, then reuse the buffer for the new parameters.
      std::size_t offset = 0;
      for (std::size_t i = 0; i < grads.size(); ++i) {
        apply(i, std::span<const V>(flat.subspan(offset, grads[i].size())), V(1) / static_cast<V>(n));
        offset += grads[i].size();
      }
      pack(flat, params);
    }
    collective::broadcast(comm, flat, owner_);
    if (comm.rank() != owner_) unpack(flat, params);
  }

 private:
  void check_owner(int ranks) const {
    if (owner_ < 0 || owner_ >= ranks)
      throw error(errc::invalid_argument, "aggregation::central: owner rank " + std::to_string(owner_) +
                                              " outside 0.." + std::to_string(ranks - 1) + " (the job has " +
                                              std::to_string(ranks) + " ranks)");
  }

  // The whole model back to back in one buffer: grown once, then reused every step.
  template <class V, class Tensors>
  std::span<V> flat_for(const Tensors& tensors) {
    std::size_t total = 0;
    for (const auto& t : tensors) total += t.size();
    flat_.reserve_discard(total * sizeof(V));
    return {reinterpret_cast<V*>(flat_.data()), total};
  }

  template <class V, class Tensors>
  static void pack(std::span<V> flat, const Tensors& tensors) {
    V* to = flat.data();
    for (const auto& t : tensors) {
      if (t.size()) std::memcpy(to, t.data(), t.size() * sizeof(V));
      to += t.size();
    }
  }

  template <class V, class Tensors>
  static void unpack(std::span<V> flat, const Tensors& tensors) {
    const V* from = flat.data();
    for (const auto& t : tensors) {
      if (t.size()) std::memcpy(t.data(), from, t.size() * sizeof(V));
      from += t.size();
    }
  }

  int owner_;
  aligned_buffer<std::byte> flat_;
};

static_assert(concepts::aggregation<central, float, transport::local>);
static_assert(concepts::aggregation<central, double, transport::local>);

}  // namespace gradwire::aggregation
