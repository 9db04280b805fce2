// ZeRO stage 1 (Rajbhandari et al. 2020): optimizer state sharded across the replicas; reduce-scatter, step on one's own shard, all-gather.
//
// Every replica holds all the parameters but the optimizer state (momentum's velocity,
// Adam's two moments) of 1/N of them: its shard. A step reduce-scatters each bucket of
// gradients (rank r ends with the sum of chunk r of the bucket, the ring's chunking), runs
// the optimizer on that chunk alone with grad_scale = 1/N, and all-gathers the updated
// parameters of the bucket. The traffic is the ring all-reduce's, 2(N-1)/N of the model
// per rank (the ring *is* a reduce-scatter and an all-gather); the state is 1/N: for
// mixed-precision Adam, 16 bytes per parameter become 4 + 12/N.
//
// Bit-identical to aggregation::all_reduce_with<collective::ring> (SGD, momentum, Adam:
// every optimizer that works element by element): the reduce-scatter adds each element in
// the ring's order, as the ring all-reduce does, and the optimizer step on an element does
// not depend on the others. That holds for the same buckets: the shards are planned once,
// at setup, over the tensors in reverse order (the order backward produces them, which
// all_reduce keeps when gradients come in that order), and never re-planned, since the
// optimizer state is sized to them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "../collective/all_gather.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/chunking.hpp"
#include "../collective/communicator.hpp"
#include "../collective/reduce_scatter.hpp"
#include "../concepts.hpp"
#include "../tensor/element_range.hpp"
#include "detail/bucketed_reduction.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

template <class V, class Tr>
class sharded_agent;

// The policy: the bucket budget (collective::default_bucket_bytes = 25 MiB), as all_reduce's.
class sharded {
 public:
  template <class V, class Tr>
  using agent = sharded_agent<V, Tr>;

  explicit sharded(std::size_t bucket_bytes = collective::default_bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

 private:
  std::size_t bucket_bytes_;
};

// One replica's ZeRO-1 state: the buckets, which elements of each tensor it owns, and the
// all-gathers in flight.
template <class V, class Tr>
class sharded_agent {
 public:
  explicit sharded_agent(const sharded& policy) : buckets_(policy.bucket_bytes()) {}

  // Which elements of tensor i this rank steps (concepts::sharding_agent); known after setup.
  element_range owned(std::size_t i) const noexcept { return owned_[i]; }
  const flat_layout& layout() const noexcept { return buckets_.schedule().layout(); }
  std::span<const collective::bucket> buckets() const noexcept { return buckets_.schedule().buckets(); }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::sharded", "every shard of the optimizer state lives on one rank only");
    for (auto p : params) collective::broadcast(comm, p, 0);
    buckets_.setup(params, comm.size() > 1);
    plan_shards(comm, params);
    gathers_.reserve(buckets().size());
  }

  void begin_step(collective::communicator<Tr>&) {
    gathers_.clear();  // a step given up midway: each handle waits for its all-gather
    buckets_.begin_step();
  }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    buckets_.ready(comm, i, grad, [this](collective::communicator<Tr>& c, std::size_t k) { reduce_scatter(c, k); });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, Apply&& apply) {
    if (buckets_.applied_alone(comm, apply)) return;
    const V scale = V(1) / static_cast<V>(comm.size());
    const auto plan = buckets();
    if (buckets_.single_bucket()) {
      reduce_scatter(comm, 0);
      step_own_chunk(comm, 0, params, apply, scale);
      all_gather(comm, 0);
      scatter(0, params);
      return;
    }
    // Bucket k's shard steps while later buckets are still reduced; its all-gather then
    // queues behind them on the communicator's thread.
    for (std::size_t k = 0; k < plan.size(); ++k) {
      buckets_.wait(comm, k);
      step_own_chunk(comm, k, params, apply, scale);
      gathers_.push_back(comm.async().submit([this, k](collective::communicator<Tr>& c) { all_gather(c, k); }));
    }
    buckets_.waited_all();
    for (std::size_t k = 0; k < plan.size(); ++k) {
      gathers_[k].wait(comm.queued_collective_deadline());
      scatter(k, params);
    }
    gathers_.clear();
  }

 private:
  // Rank r owns chunk r (the ring's chunking) of every bucket; each tensor meets that chunk
  // in at most one run of elements, since a bucket holds whole tensors back to back.
  void plan_shards(const collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    owned_.assign(params.size(), {});
    if (comm.size() == 1) {
      for (std::size_t i = 0; i < params.size(); ++i) owned_[i] = {0, params[i].size()};
      return;
    }
    const flat_layout& flat = layout();
    for (const auto& b : buckets()) {
      const collective::detail::chunking chunks{b.count, static_cast<std::size_t>(comm.size())};
      const std::size_t mine = b.offset + chunks.begin(static_cast<std::size_t>(comm.rank()));
      const std::size_t mine_end = mine + chunks.length(static_cast<std::size_t>(comm.rank()));
      for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
        const std::size_t i = flat.order()[p];
        const std::size_t from = std::max(mine, flat.offset(i)), to = std::min(mine_end, flat.offset(i) + flat.size(i));
        if (from < to) owned_[i] = {from - flat.offset(i), to - from};
      }
    }
  }

  void reduce_scatter(collective::communicator<Tr>& comm, std::size_t k) {
    auto trace = collective::trace_bucket<Tr, V>(comm, buckets()[k], k);
    collective::reduce_scatter(comm, buckets_.schedule().flat(buckets()[k]));
  }

  // The optimizer on this rank's part of each tensor of bucket k, then those parameters
  // into the rank's chunk of the bucket's buffer (its sums are used up), for the all-gather.
  template <class Apply>
  void step_own_chunk(collective::communicator<Tr>&, std::size_t k, std::span<const std::span<V>> params,
                      Apply& apply, V scale) {
    const flat_layout& flat = layout();
    const std::span<V> sums = buckets_.schedule().flat();
    const auto& b = buckets()[k];
    for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
      const std::size_t i = flat.order()[p];
      const element_range r = owned_[i];
      if (r.empty()) continue;
      const std::span<V> at = sums.subspan(flat.offset(i) + r.offset, r.count);
      apply(i, std::span<const V>(at), scale);
      std::memcpy(at.data(), params[i].data() + r.offset, r.count * sizeof(V));
    }
  }

  void all_gather(collective::communicator<Tr>& comm, std::size_t k) {
    collective::all_gather(comm, buckets_.schedule().flat(buckets()[k]));
  }

  // Every rank's updated chunk of bucket k, into the parameters.
  void scatter(std::size_t k, std::span<const std::span<V>> params) {
    const auto& b = buckets()[k];
    layout().scatter(std::span<const V>(buckets_.schedule().flat()), params, b.first_tensor, b.end_tensor);
  }

  detail::bucketed_reduction<V, Tr> buckets_;  // the reduce-scatters in flight end before the agent goes
  std::vector<element_range> owned_;          // [tensor]: the elements this rank steps
  std::vector<collective::async_handle> gathers_;  // last, so destroyed first: the all-gathers in flight
};

static_assert(concepts::incremental_aggregation<sharded, float, concepts::detail::transport_archetype>);
static_assert(concepts::incremental_aggregation<sharded, double, concepts::detail::transport_archetype>);
static_assert(concepts::sharding_agent<sharded_agent<float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
