// Synchronous all-reduce aggregation (MirroredStrategy, MultiWorkerMirroredStrategy, DDP).
//
// Every replica copies its gradients into one fused bucket, the bucket is summed across
// replicas, and every replica applies the same optimizer step to the same sum with
// grad_scale = 1/N (the average is fused into the step). Replicas started equal (setup
// broadcasts rank 0's parameters) therefore stay bit-identical.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>

#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/communicator.hpp"
#include "../tensor/aligned_buffer.hpp"

namespace gradwire::aggregation {

template <class Algorithm = collective::auto_>
struct all_reduce_with {
  using algorithm = Algorithm;

  template <class Tr, class V>
  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) collective::broadcast(comm, p, 0);
  }

  template <class Tr, class V, class Apply>
  void step(collective::communicator<Tr>& comm, std::span<const std::span<V>>,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    if (comm.size() == 1) {
      for (std::size_t i = 0; i < grads.size(); ++i) apply(i, grads[i], V(1));
      return;
    }
    std::size_t total = 0;
    for (auto g : grads) total += g.size();
    bucket_.reserve_discard(total * sizeof(V));
    std::span<V> bucket(reinterpret_cast<V*>(bucket_.data()), total);
    std::size_t offset = 0;
    for (auto g : grads) {
      if (!g.empty()) std::memcpy(bucket.data() + offset, g.data(), g.size_bytes());
      offset += g.size();
    }
    collective::all_reduce<Algorithm>(comm, bucket, collective::reduce_op::sum);
    const V scale = V(1) / static_cast<V>(comm.size());
    offset = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      apply(i, std::span<const V>(bucket.subspan(offset, grads[i].size())), scale);
      offset += grads[i].size();
    }
  }

 private:
  aligned_buffer<std::byte> bucket_;  // reused across steps
};

using all_reduce = all_reduce_with<>;

}  // namespace gradwire::aggregation
