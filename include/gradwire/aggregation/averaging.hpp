// Model averaging / local SGD and DiLoCo: every replica steps on its own gradient; every H steps the parameters are averaged (or stepped by an outer optimizer).
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
//
// An outer optimizer (DiLoCo, Douillard et al. 2023): averaging<H, Outer> with Outer any
// gradwire optimizer (concepts::optimizer). Each replica keeps the anchor theta, the
// parameters of the last synchronisation (rank 0's after setup). At a synchronisation
// point the pseudo-gradient
//     Delta = mean_r(theta - theta_r)        one all-reduce (average) of theta - theta_r
// is handed to the outer optimizer as a gradient of theta (grad_scale 1):
//     theta <- outer_step(theta, Delta)      e.g. Nesterov: v <- mu v + Delta,
//                                            theta <- theta - lr (Delta + mu v)
// and every replica goes on from the new theta (its inner optimizer, the strategy's, keeps
// its own state). DiLoCo's defaults, which aggregation::diloco() (diloco.hpp) gives: outer
// SGD with Nesterov momentum, lr 0.7, momentum 0.9; inner AdamW. With outer SGD at lr 1
// and no momentum, theta - (theta - mean) is the plain mean up to float rounding. Without
// an Outer (no_outer, the default) nothing of this exists: the code path is local SGD's.
// Memory per replica beyond local SGD's one flat buffer: the anchor (1x the parameters)
// and the outer state (momentum 1x, Adam 2x, SGD none), allocated and touched at setup.
//
// Streaming (Streaming DiLoCo, Douillard et al. 2025): stream(F, delay) cuts the flat
// parameters (index order) into F fragments of about equal bytes; fragment f synchronises
// after local step s (counted from 1) when s % H == f*H/F, so the all-reduces are spread
// over the period instead of all at step H. With delay D > 0 a fragment's all-reduce runs
// on the communicator's async engine while D more inner steps run, and its outer update
// lands right after step s + D, replacing the fragment's parameters (the D inner steps
// on that fragment are dropped); D = 0 lands it in step s, blocking. 0 <= D < H: a
// fragment's update lands before its next all-reduce starts. F = 1, D = 0 is the
// non-streaming algorithm, the same code. While an all-reduce is in flight only the
// engine may use the communicator: call wait_in_flight(comm) on the agent before running
// collectives of your own between steps. Updates still pending after the last step land
// with strategy.flush() (a strategy destroyed with some pending warns: they are lost).
// Checkpoints carry the step count, the anchor, the outer state and the pending fragments
// (checkpoint.hpp, concepts::checkpointing_agent): a restored job goes on bit for bit.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../tensor/flat_layout.hpp"
#include "detail/outer_step.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

// averaging<dynamic_period> takes its period at run time, as std::span takes its extent.
inline constexpr int dynamic_period = -1;

// averaging's Outer when there is none: the replicas take the mean of their parameters.
struct no_outer {};

template <int H, class V, class Tr, class Outer = no_outer, class Codec = no_codec>
class averaging_agent;

// The policy. H: average the parameters after every H-th local step, H >= 1 (H = 1:
// after every step); or dynamic_period, and the period is given to the constructor
// (checked there). Outer: no_outer (local SGD), or the outer optimizer
// (concepts::optimizer, e.g. optim::momentum with nesterov: DiLoCo), given to the
// constructor. Codec (with an outer optimizer): no_codec, or the concepts::compressor the
// pseudo-gradients travel through (compress(codec): bf16, int8, ...).
template <int H = dynamic_period, class Outer = no_outer, class Codec = no_codec>
class averaging {
  static_assert(H >= 1 || H == dynamic_period,
                "gradwire::aggregation::averaging<H>: the period H must be >= 1 (average the parameters every H "
                "local steps; H = 1 averages after every step), or dynamic_period to give it at run time");

 public:
  static constexpr int period = H;  // dynamic_period when given at run time: see every()
  static constexpr bool has_outer = !std::is_same_v<Outer, no_outer>;
  static constexpr bool has_codec = !std::is_same_v<Codec, no_codec>;
  static_assert(has_outer || !has_codec,
                "gradwire::aggregation::averaging<H, no_outer, Codec>: a codec compresses DiLoCo's pseudo-gradients; "
                "give an outer optimizer (aggregation::diloco) or leave the codec out");
  using outer_optimizer_type = Outer;
  using codec_type = Codec;
  template <class V, class Tr>
  using agent = averaging_agent<H, V, Tr, Outer, Codec>;

  // bucket_bytes: the budget of one all-reduce call (collective::default_bucket_bytes);
  // every bucket lives in the same flat buffer, allocated once.
  explicit averaging(std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H != dynamic_period && !has_outer)
      : every_(H), bucket_bytes_(bucket_bytes) {}
  // averaging<4>(8) reads as a period but would be a bucket budget: say std::size_t.
  template <std::signed_integral I>
  explicit averaging(I)
    requires(H != dynamic_period)
  = delete;

  // every: the period; below 1 it is refused with errc::invalid_argument.
  explicit averaging(int every, std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H == dynamic_period && !has_outer)
      : every_(checked(every)), bucket_bytes_(bucket_bytes) {}

  // With an outer optimizer (DiLoCo): `outer` steps the anchor at each synchronisation;
  // bucket_bytes is the most one all-reduce call of the pseudo-gradient takes.
  explicit averaging(Outer outer, std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H != dynamic_period && has_outer)
      : every_(H), bucket_bytes_(bucket_bytes), outer_(std::move(outer)) {}
  averaging(int every, Outer outer, std::size_t bucket_bytes = collective::default_bucket_bytes)
    requires(H == dynamic_period && has_outer)
      : every_(checked(every)), bucket_bytes_(bucket_bytes), outer_(std::move(outer)) {}

  // Streaming (with an outer optimizer): F fragments synchronised at staggered steps, each
  // update landing `delay` steps after its all-reduce starts (see the top of this file).
  // F >= 1 (at most the model's elements, checked at setup) and 0 <= delay < the period;
  // refused with errc::invalid_argument otherwise.
  averaging& stream(int fragments, int delay = 0) &
    requires(has_outer)
  {
    if (fragments < 1)
      throw error(errc::invalid_argument, "aggregation::averaging::stream: the fragment count must be >= 1 (1: the "
                                          "whole model at once), got " +
                                              std::to_string(fragments));
    if (delay < 0 || delay >= every_)
      throw error(errc::invalid_argument,
                  "aggregation::averaging::stream: the delay must be in [0, period) = [0, " + std::to_string(every_) +
                      ") steps, so that a fragment's outer update lands before its next all-reduce starts; got " +
                      std::to_string(delay) + " (raise the period or lower the delay)");
    fragments_ = fragments;
    delay_ = delay;
    return *this;
  }
  averaging&& stream(int fragments, int delay = 0) &&
    requires(has_outer)
  {
    return std::move(stream(fragments, delay));
  }
  // The same policy with its pseudo-gradients all-reduced through `codec` (a
  // concepts::compressor: compress::bf16, compress::int8, ...; collective::compressed_all_reduce
  // keeps them the same bits on every rank). Streaming DiLoCo sends its outer gradients in
  // 4 bits; bf16 halves and int8 quarters the bytes of float.
  template <class C>
  averaging<H, Outer, C> compress(C codec) const
    requires(has_outer)
  {
    averaging<H, Outer, C> out(every_, bucket_bytes_, outer_, std::move(codec));
    out.average_state_ = average_state_;
    out.fragments_ = fragments_;
    out.delay_ = delay_;
    return out;
  }
  const Codec& codec() const noexcept
    requires(has_codec)
  {
    return codec_;
  }

  int fragments() const noexcept { return fragments_; }  // 1 unless streaming
  int delay() const noexcept { return delay_; }          // steps from a fragment's all-reduce to its update
  const Outer& outer_optimizer() const noexcept
    requires(has_outer)
  {
    return outer_;
  }

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

  template <int, class, class>
  friend class averaging;
  // compress(): the settings of another averaging, with a codec.
  averaging(int every, std::size_t bucket_bytes, Outer outer, Codec codec)
    requires(has_codec)
      : every_(every), bucket_bytes_(bucket_bytes), outer_(std::move(outer)), codec_(std::move(codec)) {}

  int every_;
  std::size_t bucket_bytes_;
  bool average_state_ = false;
  [[no_unique_address]] Outer outer_{};
  int fragments_ = 1, delay_ = 0;
  [[no_unique_address]] Codec codec_{};
};

// One replica's local-SGD state: its step count and the buffers of an averaging step
// (with an outer optimizer: the anchor and the outer state, detail/outer_step.hpp).
template <int H, class V, class Tr, class Outer, class Codec>
class averaging_agent {
  using policy_type = averaging<H, Outer, Codec>;
  static constexpr bool has_outer = policy_type::has_outer;
  static_assert(!has_outer || concepts::optimizer<Outer, V>,
                "gradwire::aggregation::averaging<H, Outer>: Outer, the outer optimizer, does not satisfy "
                "gradwire::concepts::optimizer for this value type (needs state<V>, init<V>(n) and step(state, params, "
                "grads, scale); see concepts.hpp), or is no_outer for plain averaging");
  static_assert(!policy_type::has_codec || concepts::compressor<Codec, V>,
                "gradwire::aggregation::averaging<H, Outer, Codec>: Codec does not satisfy "
                "gradwire::concepts::compressor for this value type (see concepts.hpp and gradwire/compress/)");
  struct none {};
  using outer_type = std::conditional_t<has_outer, detail::outer_step<V, Outer, Codec>, none>;

 public:
  explicit averaging_agent(const policy_type& policy)
      : policy_(policy), buckets_(policy.bucket_bytes()), outer_(make_outer(policy)) {
    if (policy.averages_optimizer_state() && (policy.fragments() > 1 || policy.delay() > 0))
      throw error(errc::invalid_argument, "aggregation::averaging: average_optimizer_state() does not combine with "
                                          "stream() (the inner state has no one synchronisation step): turn one off");
  }

  int every() const noexcept { return policy_.every(); }
  bool averages_optimizer_state() const noexcept { return policy_.averages_optimizer_state(); }
  std::uint64_t steps() const noexcept { return steps_; }  // local steps since setup
  // Streaming with a delay: all-reduces run on the communicator's thread across steps.
  bool communicates_between_steps() const noexcept { return has_outer && policy_.delay() > 0; }
  // The anchor theta (with an outer optimizer): the parameters of the last synchronisation,
  // flat, in the parameters' index order; the same on every replica.
  std::span<const V> anchor() const noexcept
    requires(has_outer)
  {
    return outer_.anchor();
  }
  // Waits for the all-reduces running in the background (streaming with a delay), so that
  // the caller's thread may run collectives of its own on `comm` between steps; their
  // updates still land at their steps. Nothing to wait for otherwise.
  void wait_in_flight(collective::communicator<Tr>& comm) {
    if constexpr (has_outer) outer_.wait_in_flight(comm);
  }

  // Streaming with a delay: the fragments whose all-reduce has started and whose outer
  // update has not landed yet (0 otherwise, and after flush).
  std::size_t pending_updates() const noexcept {
    if constexpr (has_outer)
      return outer_.pending();
    else
      return 0;
  }
  // Lands those updates now, each after its all-reduce (strategy<>::flush(), after the last
  // step): the outer step they owe is applied as if their delay had ended with the latest
  // step, so no communicated update is lost and the communicator is free afterwards. Every
  // rank calls it after the same step; training may go on (each fragment then starts again
  // at its next scheduled step).
  void flush(collective::communicator<Tr>& comm, std::span<const std::span<V>> params)
    requires(has_outer)
  {
    outer_.flush(comm, params);
  }
  // strategy<>'s destructor: updates still pending there are never applied; say so, once.
  void finish(collective::communicator<Tr>& comm)
    requires(has_outer)
  {
    if (const std::size_t n = pending_updates(); n > 0)
      observe::log(comm.time(), observe::log_level::warning, comm.rank(), comm.size(),
                   "averaging (DiLoCo): the strategy ended with ", n,
                   n == 1 ? " fragment's outer update" : " fragments' outer updates",
                   " pending: all-reduced, not applied to its parameters (a checkpoint saved after the last step "
                   "keeps them for a resumed run); call strategy.flush() after the last step to apply them");
  }

  // Checkpoints (concepts::checkpointing_agent), with an outer optimizer: save_checkpoint and
  // load_checkpoint carry the local step count, the anchor, the outer optimizer's state, the
  // pending fragments (their mean pseudo-gradient and the step they land after) and the
  // codec's state, so a job restored at any step goes on bit for bit. The kind names the
  // settings they fit; a file of another kind is refused.
  std::string checkpoint_kind() const
    requires(has_outer)
  {
    return "averaging (period " + std::to_string(policy_.every()) + ", " + std::to_string(policy_.fragments()) +
           (policy_.fragments() == 1 ? " fragment" : " fragments") + ", delay " + std::to_string(policy_.delay()) +
           ", outer optimizer '" + outer_name() + "'" + codec_kind() + ")";
  }
  template <class F>
  void for_each_checkpoint_buffer(F&& f)
    requires(has_outer)
  {
    require_checkpointable_outer();
    outer_.for_each_buffer(f);
  }
  template <class F>
  void for_each_checkpoint_buffer(F&& f) const
    requires(has_outer)
  {
    require_checkpointable_outer();
    outer_.for_each_buffer(f);
  }
  template <class F>
  void for_each_checkpoint_counter(F&& f)
    requires(has_outer)
  {
    f(steps_);
    outer_.for_each_counter(f);
  }
  template <class F>
  void for_each_checkpoint_counter(F&& f) const
    requires(has_outer)
  {
    f(steps_);
    outer_.for_each_counter(f);
  }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::averaging (local_sgd)", "every averaging waits for every rank");
    for (auto p : params) collective::broadcast(comm, p, 0);
    steps_ = 0;
    grads_.assign(params.size(), {});
    if constexpr (has_outer) {
      outer_.setup(params, comm.size());  // the anchor, the pseudo-gradient buffer, the outer state: allocated and touched
      if (policy_.delay() > 0 && comm.size() > 1) comm.async();  // the engine's thread starts now, not in a step
      return;
    }
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
    if constexpr (has_outer) {
      outer_.after_step(comm, params, steps_);  // the fragments due, in the same order on every rank
      return;
    }
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

  static constexpr void require_checkpointable_outer() {
    static_assert(concepts::checkpointable_optimizer<Outer, V>,
                  "gradwire checkpoints of averaging<H, Outer> (DiLoCo): the outer optimizer needs a name and "
                  "state<V>::for_each_buffer(f) / for_each_counter(f) (concepts::checkpointable_optimizer; "
                  "gradwire/optim/momentum.hpp has both)");
  }
  // A file saved with another codec (or none) resumes on another path: its kind differs.
  static std::string codec_kind() {
    if constexpr (!policy_type::has_codec)
      return "";
    else if constexpr (requires { Codec::name; })
      return std::string(", codec '") + Codec::name + "'";
    else
      return ", a codec without a name";
  }
  std::string outer_name() const
    requires(has_outer)
  {
    if constexpr (concepts::named_by_type<Outer>)
      return std::string(std::string_view(Outer::name));
    else
      return std::string(policy_.outer_optimizer().name());
  }

  static outer_type make_outer(const policy_type& policy) {
    if constexpr (has_outer) {
      const detail::fragment_schedule schedule{static_cast<std::uint64_t>(policy.every()),
                                               static_cast<std::uint64_t>(policy.fragments()),
                                               static_cast<std::uint64_t>(policy.delay())};
      if constexpr (policy_type::has_codec)
        return outer_type(policy.outer_optimizer(), schedule, policy.bucket_bytes() / sizeof(V), policy.codec());
      else
        return outer_type(policy.outer_optimizer(), schedule, policy.bucket_bytes() / sizeof(V));
    } else {
      return {};
    }
  }

  policy_type policy_;
  std::uint64_t steps_ = 0;
  std::vector<std::span<const V>> grads_;  // this step's, applied at finish
  aligned_buffer<V> state_flat_;           // the optimizer buffers, back to back, when averaged
  collective::bucket_buffer buckets_;      // plan and flat buffer, reused across averaging steps
  // Last, so destroyed first: its handles wait for their all-reduces while the rest is here.
  [[no_unique_address]] outer_type outer_;  // with an outer optimizer: anchor, outer state, fragments
};

static_assert(concepts::incremental_aggregation<averaging<1>, float, concepts::detail::transport_archetype>);
static_assert(
    concepts::incremental_aggregation<averaging<dynamic_period>, double, concepts::detail::transport_archetype>);
static_assert(concepts::state_averaging_agent<averaging_agent<1, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
