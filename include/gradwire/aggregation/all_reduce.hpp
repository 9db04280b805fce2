// Synchronous all-reduce aggregation (MirroredStrategy, MultiWorkerMirroredStrategy, DDP).
//
// Gradients go into buckets (default 25 MiB each) in the order backward produces them;
// a bucket is summed across replicas on the communicator's background thread
// (communicator::async()) as soon as its last gradient is ready, so communication hides
// behind the rest of the backward pass. At finish every replica applies the same
// optimizer step to the same sums with grad_scale = 1/N (the average is fused into the
// step), bucket by bucket, while later buckets are still being reduced. Replicas started
// equal (setup broadcasts rank 0's parameters) therefore stay bit-identical.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "detail/bucketed_reduction.hpp"

namespace gradwire::aggregation {

template <class Algorithm, class V, class Tr>
class all_reduce_agent;

// The policy. Algorithm: collective::auto_, ring, halving_doubling or hierarchical (see
// collective/all_reduce.hpp).
template <class Algorithm = collective::auto_>
class all_reduce_with {
 public:
  using algorithm = Algorithm;
  template <class V, class Tr>
  using agent = all_reduce_agent<Algorithm, V, Tr>;

  // bucket_bytes: the budget of one bucket (collective::default_bucket_bytes = 25 MiB).
  explicit all_reduce_with(std::size_t bucket_bytes = collective::default_bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

 private:
  std::size_t bucket_bytes_;
};

using all_reduce = all_reduce_with<>;

// One replica's all-reduce state: the buckets and their reductions in flight.
template <class Algorithm, class V, class Tr>
class all_reduce_agent {
 public:
  using algorithm = Algorithm;
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  explicit all_reduce_agent(const all_reduce_with<Algorithm>& policy) : buckets_(policy.bucket_bytes()) {}

  std::size_t bucket_bytes() const noexcept { return buckets_.schedule().budget_bytes(); }
  // The current plan (tensors in flat order, and the buckets over them), for tests and tools.
  const flat_layout& layout() const noexcept { return buckets_.schedule().layout(); }
  std::span<const collective::bucket> buckets() const noexcept { return buckets_.schedule().buckets(); }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) collective::broadcast(comm, p, 0);
    buckets_.setup(params, comm.size() > 1);
  }

  void begin_step(collective::communicator<Tr>&) { buckets_.begin_step(); }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    buckets_.ready(comm, i, grad, [this](collective::communicator<Tr>& c, std::size_t k) { reduce(c, k); });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>>, Apply&& apply) {
    if (buckets_.applied_alone(comm, apply)) return;
    const auto plan = buckets_.schedule().buckets();
    const V scale = V(1) / static_cast<V>(comm.size());
    if (buckets_.single_bucket()) {
      reduce(comm, 0);
      apply_bucket(plan[0], apply, scale);
    } else {
      // Apply bucket k while bucket k+1 is still being reduced.
      for (std::size_t k = 0; k < plan.size(); ++k) {
        buckets_.wait(comm, k);
        apply_bucket(plan[k], apply, scale);
      }
      buckets_.waited_all();
    }
    buckets_.schedule().rebuild_once(comm);
  }

 private:
  void reduce(collective::communicator<Tr>& comm, std::size_t k) {
    const collective::bucket& b = buckets_.schedule().buckets()[k];
    auto trace = collective::trace_bucket<Tr, V>(comm, b, k);
    collective::all_reduce<Algorithm>(comm, buckets_.schedule().flat(b));
  }

  // The optimizer step on every tensor of a reduced bucket.
  template <class Apply>
  void apply_bucket(const collective::bucket& b, Apply& apply, V scale) {
    for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
      const std::size_t i = buckets_.schedule().layout().order()[p];
      apply(i, std::span<const V>(buckets_.schedule().slice(i)), scale);
    }
  }

  detail::bucketed_reduction<V, Tr> buckets_;  // last: its reductions in flight end before the agent goes
};

static_assert(concepts::incremental_aggregation<all_reduce, float, concepts::detail::transport_archetype>);
static_assert(concepts::incremental_aggregation<all_reduce, double, concepts::detail::transport_archetype>);
static_assert(concepts::updates_only_through_apply<
              all_reduce_agent<collective::auto_, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
