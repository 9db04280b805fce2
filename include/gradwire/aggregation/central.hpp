// Central storage (CentralStorageStrategy): one owner rank holds the variables, the others send it gradients.
//
// Gradients go into buckets in the order backward produces them, and each bucket is
// summed onto the owner (collective::reduce, on the communicator's background thread) as
// soon as its last gradient is ready. At finish only the owner runs the optimizer
// (grad_scale 1/N, the average fused into the step) and then broadcasts the updated
// parameters (one flat broadcast), so every replica holds the owner's bits. Trade-offs:
//   - the owner's link is the bottleneck: 2x the model per step goes through one rank;
//   - the optimizer state that matters exists once (non-owners' states stay untouched),
//     and the owner alone decides the update, so replicas cannot drift apart.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../collective/reduce.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "min_replicas.hpp"
#include "detail/bucketed_reduction.hpp"

namespace gradwire::aggregation {

template <class V, class Tr>
class central_agent;

// The policy. owner: the rank that holds the authoritative variables and applies the
// optimizer; bucket_bytes: the budget of one reduction (collective::default_bucket_bytes).
class central {
 public:
  template <class V, class Tr>
  using agent = central_agent<V, Tr>;

  explicit central(int owner = 0, std::size_t bucket_bytes = collective::default_bucket_bytes)
      : owner_(owner), bucket_bytes_(bucket_bytes) {}

  int owner() const noexcept { return owner_; }
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

  // Refuses an owner outside the job.
  void check_owner(int ranks) const {
    if (owner_ < 0 || owner_ >= ranks)
      throw error(errc::invalid_argument, "aggregation::central: owner rank " + std::to_string(owner_) +
                                              " outside 0.." + std::to_string(ranks - 1) + " (the job has " +
                                              std::to_string(ranks) + " ranks)");
  }

 private:
  int owner_;
  std::size_t bucket_bytes_;
};

template <class V, class Tr>
class central_agent {
 public:
  explicit central_agent(const central& policy) : policy_(policy), buckets_(policy.bucket_bytes()) {}

  int owner() const noexcept { return policy_.owner(); }

  // Replicas start with the owner's parameters; also sizes (and pre-faults) the buckets,
  // whose flat buffer the broadcast uses in a job of one rank too.
  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::central (central_storage)",
                                "the owner holds the only optimizer state, and every step waits for every rank");
    policy_.check_owner(comm.size());
    buckets_.setup(params, true);
    broadcast_parameters(comm, params);
  }

  void begin_step(collective::communicator<Tr>&) { buckets_.begin_step(); }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    buckets_.ready(comm, i, grad, [this](collective::communicator<Tr>& c, std::size_t k) { reduce(c, k); });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, Apply&& apply) {
    if (buckets_.applied_alone(comm, apply)) return;
    auto& schedule = buckets_.schedule();
    if (buckets_.single_bucket()) {
      reduce(comm, 0);
    } else {
      for (std::size_t k = 0; k < schedule.buckets().size(); ++k) buckets_.wait(comm, k);
      buckets_.waited_all();
    }
    if (comm.rank() == policy_.owner())
      for (std::size_t i = 0; i < params.size(); ++i)
        apply(i, std::span<const V>(schedule.slice(i)), V(1) / static_cast<V>(comm.size()));
    // The background thread is idle: the rebuild and the broadcast run on this one.
    schedule.rebuild_once(comm);
    broadcast_parameters(comm, params);
  }

 private:
  void reduce(collective::communicator<Tr>& comm, std::size_t k) {
    const collective::bucket& b = buckets_.schedule().buckets()[k];
    auto trace = collective::trace_bucket<Tr, V>(comm, b, k);
    collective::reduce(comm, buckets_.schedule().flat(b), policy_.owner());
  }

  // The owner's parameters to every rank, through the (reused) flat buffer.
  void broadcast_parameters(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    auto& schedule = buckets_.schedule();
    const flat_layout& layout = schedule.layout();
    if (comm.rank() == policy_.owner()) layout.gather(params, schedule.flat());
    collective::broadcast(comm, schedule.flat(), policy_.owner());
    if (comm.rank() != policy_.owner()) layout.scatter(std::span<const V>(schedule.flat()), params);
  }

  central policy_;
  detail::bucketed_reduction<V, Tr> buckets_;  // last: its reductions in flight end before the policy goes
};

static_assert(concepts::incremental_aggregation<central, float, concepts::detail::transport_archetype>);
static_assert(concepts::incremental_aggregation<central, double, concepts::detail::transport_archetype>);

}  // namespace gradwire::aggregation
