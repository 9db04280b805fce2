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
#include "detail/bucket_schedule.hpp"

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

  explicit all_reduce_agent(const all_reduce_with<Algorithm>& policy) : schedule_(policy.bucket_bytes()) {}

  std::size_t bucket_bytes() const noexcept { return schedule_.budget_bytes(); }
  // The current plan (tensors in flat order, and the buckets over them), for tests and tools.
  const flat_layout& layout() const noexcept { return schedule_.layout(); }
  std::span<const collective::bucket> buckets() const noexcept { return schedule_.buckets(); }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) collective::broadcast(comm, p, 0);
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    alone_.assign(params.size(), {});
    if (comm.size() > 1) schedule_.plan(sizes);
    pending_.reserve(schedule_.buckets().size());
  }

  void begin_step(collective::communicator<Tr>&) {
    pending_.clear();  // a step given up midway: each handle waits for its reduction
    schedule_.begin_step();
  }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    if (comm.size() == 1) {
      alone_[i] = grad;
      return;
    }
    schedule_.ready(i, grad, [&](std::size_t k) { launch(comm, k); });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>>, Apply&& apply) {
    if (comm.size() == 1) {
      for (std::size_t i = 0; i < alone_.size(); ++i) apply(i, alone_[i], V(1));
      return;
    }
    const auto plan = schedule_.buckets();
    const V scale = V(1) / static_cast<V>(comm.size());
    if (plan.size() == 1) {
      // One bucket: nothing to overlap, so reduce on this thread and spare the two
      // hand-offs to the background thread (they cost most when cores are oversubscribed).
      reduce(comm, 0);
      apply_bucket(plan[0], apply, scale);
    } else {
      // Apply bucket k while bucket k+1 is still being reduced.
      for (std::size_t k = 0; k < plan.size(); ++k) {
        pending_[k].wait(comm.queued_collective_deadline());
        apply_bucket(plan[k], apply, scale);
      }
      pending_.clear();
    }
    schedule_.rebuild_once(comm);
  }

 private:
  void launch(collective::communicator<Tr>& comm, std::size_t k) {
    if (schedule_.buckets().size() == 1) return;  // reduced at finish, on the caller's thread
    pending_.push_back(comm.async().submit([this, k](collective::communicator<Tr>& c) { reduce(c, k); }));
  }

  void reduce(collective::communicator<Tr>& comm, std::size_t k) {
    const collective::bucket& b = schedule_.buckets()[k];
    auto trace = collective::trace_bucket<Tr, V>(comm, b, k);
    collective::all_reduce<Algorithm>(comm, schedule_.flat(b));
  }

  // The optimizer step on every tensor of a reduced bucket.
  template <class Apply>
  void apply_bucket(const collective::bucket& b, Apply& apply, V scale) {
    for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
      const std::size_t i = schedule_.layout().order()[p];
      apply(i, std::span<const V>(schedule_.slice(i)), scale);
    }
  }

  detail::bucket_schedule<V> schedule_;
  std::vector<std::span<const V>> alone_;  // one rank: this step's gradients, applied as they are
  // Last, so destroyed first: each waits for its reduction before the buffers go.
  std::vector<collective::async_handle> pending_;
};

static_assert(concepts::incremental_aggregation<all_reduce, float, concepts::detail::transport_archetype>);
static_assert(concepts::incremental_aggregation<all_reduce, double, concepts::detail::transport_archetype>);
static_assert(concepts::updates_only_through_apply<
              all_reduce_agent<collective::auto_, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
