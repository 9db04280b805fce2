// Model averaging / local SGD: every replica steps on its own gradient; every H steps the parameters are averaged.
//
// Each replica applies the optimizer to its own gradient (apply(i, grad, 1)), so replicas
// drift apart between averaging points; after every H-th step (counted from setup, i.e.
// from the strategy's construction) the parameters are all-reduced with reduce_op::average
// over one flat buffer that is reused across steps, and the replicas are bit-identical
// again. Communication drops by a factor H compared with aggregation::all_reduce.
//
// With H = 1 and plain SGD this equals synchronous gradient averaging
// (aggregation::all_reduce) up to float rounding: from equal parameters p,
// mean_r(p - lr*g_r) == p - lr*mean_r(g_r). The optimizer state (velocity, moments) stays
// local to each replica and is never averaged, only the parameters are. That costs
// nothing for momentum at H = 1 (linear in g: the mean of the local velocities is the
// synchronous velocity), but Adam and AdamW differ (mean_r(m_r/sqrt(v_r)) is not
// m/sqrt(v) of the mean gradient), and for H > 1 each replica carries its own state
// across averaging points, unless average_optimizer_state() is on: then the optimizer's
// buffers (velocity, moments) are averaged at every averaging point too, one flat
// all-reduce after the parameters', and replicas leave it with identical state.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../tensor/flat_layout.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

// averaging<dynamic_period> takes its period at run time, as std::span takes its extent.
inline constexpr int dynamic_period = -1;

template <int H, class V, class Tr>
class averaging_agent;

// The policy. H: average the parameters after every H-th local step, H >= 1 (H = 1:
// after every step); or dynamic_period, and the period is given to the constructor
// (checked there).
template <int H = dynamic_period>
class averaging {
  static_assert(H >= 1 || H == dynamic_period,
                "gradwire::aggregation::averaging<H>: the period H must be >= 1 (average the parameters every H "
                "local steps; H = 1 averages after every step), or dynamic_period to give it at run time");

 public:
  static constexpr int period = H;  // dynamic_period when given at run time: see every()
  template <class V, class Tr>
  using agent = averaging_agent<H, V, Tr>;

  // bucket_bytes: the budget of one all-reduce call (collective::default_bucket_bytes);
  // every bucket lives in the same flat buffer, allocated once.
  explicit averaging(std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H != dynamic_period)
      : every_(H), bucket_bytes_(bucket_bytes) {}
  // averaging<4>(8) reads as a period but would be a bucket budget: say std::size_t.
  template <std::signed_integral I>
  explicit averaging(I)
    requires(H != dynamic_period)
  = delete;

  // every: the period; below 1 it is refused with errc::invalid_argument.
  explicit averaging(int every, std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H == dynamic_period)
      : every_(checked(every)), bucket_bytes_(bucket_bytes) {}

  // Also average the optimizer state (its buffers; step counters agree anyway) at each
  // averaging point. Needs an optimizer whose state shows its buffers (for_each_buffer).
  averaging& average_optimizer_state(bool on = true) & {
    average_state_ = on;
    return *this;
  }
  averaging&& average_optimizer_state(bool on = true) && { return std::move(average_optimizer_state(on)); }
  bool averages_optimizer_state() const noexcept { return average_state_; }

  int every() const noexcept { return every_; }  // the period in effect
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

 private:
  static int checked(int every) {
    if (every < 1)
      throw error(errc::invalid_argument, "aggregation::averaging: the period must be >= 1 (average the parameters "
                                          "every `period` local steps), got " +
                                              std::to_string(every));
    return every;
  }

  int every_;
  std::size_t bucket_bytes_;
  bool average_state_ = false;
};

// One replica's local-SGD state: its step count and the buffers of an averaging step.
template <int H, class V, class Tr>
class averaging_agent {
 public:
  explicit averaging_agent(const averaging<H>& policy) : policy_(policy), buckets_(policy.bucket_bytes()) {}

  int every() const noexcept { return policy_.every(); }
  bool averages_optimizer_state() const noexcept { return policy_.averages_optimizer_state(); }
  std::uint64_t steps() const noexcept { return steps_; }  // local steps since setup

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::averaging (local_sgd)", "every averaging waits for every rank");
    for (auto p : params) collective::broadcast(comm, p, 0);
    steps_ = 0;
    grads_.assign(params.size(), {});
    if (comm.size() == 1) return;
    // Allocate the flat buffer now and touch it (first touch of fresh memory is slow
    // here), so no averaging step allocates or faults.
    for (const auto& b : buckets_.plan<V>(params)) buckets_.gather<V>(b, params);
  }

  // Local steps communicate nothing: gradients wait here for finish.
  void begin_step(collective::communicator<Tr>&) {}
  void ready(collective::communicator<Tr>&, std::size_t i, std::span<const V> grad) { grads_[i] = grad; }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, Apply&& apply) {
    for (std::size_t i = 0; i < grads_.size(); ++i) apply(i, grads_[i], V(1));
    ++steps_;
    // Every rank counts the same steps, so every rank joins the same all-reduces.
    if (!averaging_step() || comm.size() == 1) return;
    collective::bucketed_all_reduce(comm, params, buckets_, collective::reduce_op::average);
  }

  // Called by strategy<> after each step with the replica's optimizer states, one per
  // tensor: averages their buffers when this step averaged the parameters.
  template <class W, class State>
  void synchronise_state(collective::communicator<Tr>& comm, std::span<State> states) {
    constexpr bool visitable = concepts::buffer_visiting_state<State>;
    // Refused on one rank as on many: a job tried alone must not fail only once it scales out.
    if (!visitable && policy_.averages_optimizer_state() && averaging_step())
      throw error(errc::invalid_argument, "aggregation::averaging: average_optimizer_state() needs an optimizer whose "
                                          "state<V> has for_each_buffer(f) (see gradwire/optim/adam.hpp)");
    if (!policy_.averages_optimizer_state() || comm.size() == 1 || !averaging_step()) return;
    if constexpr (visitable) {
      std::vector<std::span<V>> buffers;
      for (auto& st : states) st.for_each_buffer([&](std::span<V> b) { buffers.push_back(b); });
      const flat_layout layout = flat_layout::of(buffers);
      if (layout.total() == 0) return;  // plain SGD: nothing to average (the same on every rank)
      state_flat_.reserve_discard(layout.total());
      const std::span<V> flat(state_flat_.data(), layout.total());
      layout.gather(buffers, flat);
      collective::all_reduce(comm, flat, collective::reduce_op::average);
      layout.scatter(std::span<const V>(flat), buffers);
    }
  }

 private:
  bool averaging_step() const noexcept {
    return steps_ > 0 && steps_ % static_cast<std::uint64_t>(policy_.every()) == 0;
  }

  averaging<H> policy_;
  std::uint64_t steps_ = 0;
  std::vector<std::span<const V>> grads_;  // this step's, applied at finish
  aligned_buffer<V> state_flat_;           // the optimizer buffers, back to back, when averaged
  collective::bucket_buffer buckets_;      // plan and flat buffer, reused across averaging steps
};

static_assert(concepts::incremental_aggregation<averaging<1>, float, concepts::detail::transport_archetype>);
static_assert(
    concepts::incremental_aggregation<averaging<dynamic_period>, double, concepts::detail::transport_archetype>);
static_assert(concepts::state_averaging_agent<averaging_agent<1, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
