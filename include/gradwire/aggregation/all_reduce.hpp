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
#include "detail/k_of_n.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

template <class Algorithm, class V, class Tr>
class all_reduce_agent;

struct all_reduce_options {
  // The budget of one bucket (collective::default_bucket_bytes = 25 MiB).
  std::size_t bucket_bytes = collective::default_bucket_bytes;
  // K of N (Chen et al.'s backup workers, for all-reduce): a step closes when N - b
  // ranks' first buckets are ready; the late ranks' gradients are dropped and every rank
  // applies the same sum with 1 / (ranks in). 0: every rank's gradients, every step.
  // How the ranks agree without a server: docs/elastic.md.
  int backup_workers = 0;
  // K of N: how many steps a late replica's communicator thread may complete without its
  // caller (within the steps planned, all_reduce_agent::plan_steps), each kept in a buffer
  // of the model's size until the caller applies it.
  int max_steps_behind = 3;
};

// The policy. Algorithm: collective::auto_, ring, halving_doubling or hierarchical (see
// collective/all_reduce.hpp).
template <class Algorithm = collective::auto_>
class all_reduce_with {
 public:
  using algorithm = Algorithm;
  template <class V, class Tr>
  using agent = all_reduce_agent<Algorithm, V, Tr>;

  explicit all_reduce_with(std::size_t bucket_bytes = collective::default_bucket_bytes)
      : all_reduce_with(all_reduce_options{.bucket_bytes = bucket_bytes}) {}
  explicit all_reduce_with(all_reduce_options options) : options_(options) {}
  std::size_t bucket_bytes() const noexcept { return options_.bucket_bytes; }
  int backup_workers() const noexcept { return options_.backup_workers; }
  int max_steps_behind() const noexcept { return options_.max_steps_behind; }

 private:
  all_reduce_options options_;
};

using all_reduce = all_reduce_with<>;

// One replica's all-reduce state: the buckets and their reductions in flight.
template <class Algorithm, class V, class Tr>
class all_reduce_agent {
 public:
  using algorithm = Algorithm;
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  explicit all_reduce_agent(const all_reduce_with<Algorithm>& policy)
      : buckets_(policy.bucket_bytes()), k_of_n_(policy.backup_workers(), policy.max_steps_behind()) {}

  std::size_t bucket_bytes() const noexcept { return buckets_.schedule().budget_bytes(); }
  // The current plan (tensors in flat order, and the buckets over them), for tests and tools.
  const flat_layout& layout() const noexcept { return buckets_.schedule().layout(); }
  std::span<const collective::bucket> buckets() const noexcept { return buckets_.schedule().buckets(); }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::all_reduce", "a lost rank ends every step of the job");
    for (auto p : params) collective::broadcast(comm, p, 0);
    buckets_.setup(params, comm.size() > 1);
    if (k_of_n_.enabled())
      k_of_n_.setup(comm, buckets_.schedule().flat(), buckets_.schedule().buckets().size(),
                    [](void* self, collective::communicator<Tr>& c, std::size_t k, std::span<V> flat) {
                      static_cast<all_reduce_agent*>(self)->reduce_over(c, k, flat);
                    });
  }

  void begin_step(collective::communicator<Tr>& comm) {
    buckets_.begin_step();
    if (k_of_n_.enabled()) k_of_n_.begin_step(comm, this);
  }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    buckets_.ready(
        comm, i, grad, [this](collective::communicator<Tr>& c, std::size_t k) { reduce(c, k); },
        [this](std::size_t k) {
          if (!k_of_n_.enabled()) return true;
          if (k == 0) k_of_n_.first_bucket_ready();
          k_of_n_.bucket_launched(k);  // the step's job reduces it (an in rank's), or drops it
          return false;
        });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>>, Apply&& apply) {
    if (buckets_.applied_alone(comm, apply)) {
      ++applying_;
      return;
    }
    const auto plan = buckets_.schedule().buckets();
    if (k_of_n_.enabled()) return finish_k_of_n(comm, plan, apply);
    const V scale = V(1) / static_cast<V>(comm.size());
    if (buckets_.single_bucket()) {
      reduce(comm, 0);
      apply_bucket(plan[0], apply, scale, buckets_.schedule().flat());
    } else {
      // Apply bucket k while bucket k+1 is still being reduced.
      for (std::size_t k = 0; k < plan.size(); ++k) {
        buckets_.wait(comm, k);
        apply_bucket(plan[k], apply, scale, buckets_.schedule().flat());
      }
      buckets_.waited_all();
    }
    ++applying_;
    buckets_.schedule().rebuild_once(comm);
  }

  // K of N (all_reduce_options::backup_workers). Between steps: the next n steps run back
  // to back on every rank, so that a late replica's communicator thread may go through them
  // without its caller (every rank must plan the same steps; the caller's own collectives
  // wait until they are done). Without a plan, one step at a time: a late replica still
  // opens each step itself, and so still sets the pace (docs/elastic.md).
  void plan_steps(std::uint64_t n) { k_of_n_.plan_steps(n); }
  // Who was in the latest step this replica applied, the same on every rank (empty without
  // backups).
  const detail::step_set& last_step_set() const noexcept { return k_of_n_.last_set(); }
  // Whether the latest step closed without this replica's gradients (dropped).
  bool last_step_dropped() const noexcept { return k_of_n_.last_dropped(); }
  // How many steps the latest finish applied: 1, or more when this replica was late and
  // steps closed without it while it computed (its loop skips them).
  std::uint64_t last_steps_advanced() const noexcept { return k_of_n_.enabled() ? k_of_n_.last_advanced() : 1; }
  // With backups the steps' communication runs on the communicator's thread across step
  // boundaries (concepts::background_communicating_agent).
  bool communicates_between_steps() const noexcept { return k_of_n_.enabled(); }
  // The step whose sums are being applied (counted from 0 at setup): a learning-rate
  // schedule's input.
  std::uint64_t applying_step() const noexcept { return applying_; }

 private:
  // K of N's finish: the step's sums bucket by bucket when this rank was in; when late,
  // every step completed without it since its last finish, in order.
  template <class Apply>
  void finish_k_of_n(collective::communicator<Tr>& comm, std::span<const collective::bucket> plan, Apply& apply) {
    if (k_of_n_.in()) {
      const V scale = k_of_n_.wait_set(comm);
      applying_ = k_of_n_.step();
      for (std::size_t k = 0; k < plan.size(); ++k) {
        k_of_n_.wait_bucket(comm, k);
        apply_bucket(plan[k], apply, scale, buckets_.schedule().flat());
      }
      k_of_n_.applied(comm, applying_);
    } else {
      const auto missed = k_of_n_.wait_late(comm);
      for (const auto& m : missed) {
        applying_ = m.step;
        for (const auto& b : plan) apply_bucket(b, apply, m.scale, m.sums);
      }
      k_of_n_.applied(comm, applying_);
    }
    ++applying_;
  }

  void reduce(collective::communicator<Tr>& comm, std::size_t k) { reduce_over(comm, k, buckets_.schedule().flat()); }
  void reduce_over(collective::communicator<Tr>& comm, std::size_t k, std::span<V> flat) {
    const collective::bucket& b = buckets_.schedule().buckets()[k];
    auto trace = collective::trace_bucket<Tr, V>(comm, b, k);
    collective::all_reduce<Algorithm>(comm, flat.subspan(b.offset, b.count));
  }

  // The optimizer step on every tensor of a reduced bucket, its sums read from `flat`.
  template <class Apply>
  void apply_bucket(const collective::bucket& b, Apply& apply, V scale, std::span<const V> flat) {
    const flat_layout& layout = buckets_.schedule().layout();
    for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
      const std::size_t i = layout.order()[p];
      apply(i, std::span<const V>(layout.slice(flat, i)), scale);
    }
  }

  detail::bucketed_reduction<V, Tr> buckets_;  // its reductions in flight end before the agent goes
  std::uint64_t applying_ = 0;
  detail::k_of_n<V, Tr> k_of_n_;  // last: its job (which reduces in the buckets' buffer) ends first
};

static_assert(concepts::incremental_aggregation<all_reduce, float, concepts::detail::transport_archetype>);
static_assert(concepts::incremental_aggregation<all_reduce, double, concepts::detail::transport_archetype>);
static_assert(concepts::updates_only_through_apply<
              all_reduce_agent<collective::auto_, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
