// strategy<Tensor, Optimizer, Aggregation, Transport>: one replica's view of data-parallel training.
//
// The template alone: it includes no aggregation and no transport (a translation unit
// names the ones it uses). The named combinations (mirrored, one_device, ...) are in
// gradwire/strategies/, one header each, and all of them in gradwire/strategies.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "aggregation/agent.hpp"
#include "collective/communicator.hpp"
#include "collective/same_model.hpp"
#include "concepts.hpp"
#include "error.hpp"
#include "observe/activity.hpp"
#include "observe/log.hpp"
#include "observe/step_stats.hpp"
#include "observe/timeline.hpp"
#include "observe/type_name.hpp"
#include "support/finite_check.hpp"
#include "support/virtual_clock.hpp"
#include "tensor/aligned_buffer.hpp"
#include "tensor/dtype.hpp"
#include "tensor/flat_layout.hpp"
#include "tensor/shape.hpp"

namespace gradwire {

namespace detail {
template <class>
inline constexpr bool always_false_v = false;

// How a strategy keeps a replica whose tensors live on a device (see
// gradwire/cuda/device_replica.cuh, which specialises it for CUDA tensors).
template <class Tensor, class Optimizer, class = void>
class device_replica {
  static_assert(always_false_v<Tensor>,
                "gradwire::strategy: Tensor lives on a CUDA device: include <gradwire/cuda.cuh> and compile this "
                "translation unit with nvcc");
};
struct no_device_replica {};

// A mutex member that lets its owner stay movable (a moved-to object gets a fresh one;
// nothing may hold it during a move).
struct movable_mutex {
  std::mutex mutex;
  movable_mutex() = default;
  movable_mutex(movable_mutex&&) noexcept {}
  movable_mutex& operator=(movable_mutex&&) noexcept { return *this; }
};

// The timeline scope of the step in progress, if any (movable, unlike trace_scope).
class step_trace {
 public:
  step_trace() = default;
  step_trace(step_trace&& other) noexcept {
    if (other.scope_) scope_.emplace(std::move(*other.scope_));
    other.scope_.reset();
  }
  step_trace& operator=(step_trace&& other) noexcept {
    scope_.reset();
    if (other.scope_) scope_.emplace(std::move(*other.scope_));
    other.scope_.reset();
    return *this;
  }
  observe::trace_scope& open(observe::trace_scope scope) noexcept { return scope_.emplace(std::move(scope)); }
  void bytes(std::uint64_t n) noexcept {
    if (scope_) scope_->bytes(n);
  }
  void reset() noexcept { scope_.reset(); }

 private:
  std::optional<observe::trace_scope> scope_;
};
template <class Optimizer, class V>
struct host_state_of {
  using state_type = typename Optimizer::template state<V>;
};

}  // namespace detail

// Tag of a micro-batch step (gradient accumulation, PyTorch DDP's no_sync): the gradients
// are added up locally and nothing is communicated or applied; the next synchronised step
// communicates once, with the mean of its own and the accumulated micro-batches'
// gradients (K micro-batches of b samples then equal one step with a batch of K*b).
struct no_sync_t {
  explicit constexpr no_sync_t() = default;
};
inline constexpr no_sync_t no_sync{};

// Template parameters (each checked against its concept in concepts.hpp):
//   Tensor       concepts::tensor       where this replica's parameters and gradients live
//   Optimizer    concepts::optimizer  how an update is computed from a gradient
//   Aggregation  concepts::aggregation  how replicas agree on the update
//   Transport    concepts::transport  how bytes move between replicas
template <class Tensor, class Optimizer, class Aggregation, class Transport>
class strategy {
  static_assert(concepts::tensor<Tensor>,
                "gradwire::strategy: Tensor does not satisfy gradwire::concepts::tensor: it needs value_type (float or "
                "double), a static `location`, data(), size() and shape() (see gradwire/concepts.hpp)");
  static_assert(concepts::optimizer<Optimizer, typename Tensor::value_type>,
                "gradwire::strategy: Optimizer does not satisfy gradwire::concepts::optimizer for Tensor's value_type: it "
                "needs template<class V> struct state, init<V>(n) and step(state, params, grads, grad_scale) "
                "(see gradwire/concepts.hpp)");
  static_assert(concepts::transport<Transport>,
                "gradwire::strategy: Transport does not satisfy gradwire::concepts::transport: it needs rank(), size(), "
                "async_send, async_recv, wait(request, deadline) and a nested request type (see "
                "gradwire/concepts.hpp)");
  static_assert(concepts::aggregation<Aggregation, typename Tensor::value_type, Transport>,
                "gradwire::strategy: Aggregation does not satisfy gradwire::concepts::aggregation: it needs an agent "
                "template (agent<V, Transport> with setup, begin_step, ready, finish_step) or setup(comm, params) and "
                "step(comm, params, grads, apply) (see gradwire/concepts.hpp)");

 public:
  using tensor_type = Tensor;
  using optimizer_type = Optimizer;
  using aggregation_type = Aggregation;
  using transport_type = Transport;
  using value_type = typename Tensor::value_type;
  using communicator_type = collective::communicator<Transport>;
  // The aggregation's per-job state (concepts::aggregation_agent): Aggregation::agent<V,
  // Transport>, or aggregation::whole_step_agent around a whole-step aggregation.
  using agent_type = aggregation::agent_t<Aggregation, value_type, Transport>;
  static constexpr bool on_device = Tensor::location == memory_location::cuda;
  using device_replica_type =
      std::conditional_t<on_device, detail::device_replica<Tensor, Optimizer>, detail::no_device_replica>;
  // Host tensors: the optimizer's state<V>; CUDA tensors: optim::device_state<Optimizer, V>.
  using optimizer_state_type = typename std::conditional_t<on_device, device_replica_type,
                                                           detail::host_state_of<Optimizer, value_type>>::state_type;

  class pending_step;

  // Joins the replicas reachable through `transport` and makes their parameters equal
  // (the aggregation's setup, e.g. a broadcast from rank 0). Collective: every replica
  // constructs its strategy with tensors of the same shapes, in the same order.
  strategy(Transport transport, std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(),
           Aggregation aggregation = Aggregation(), collective::communicator_options options = {})
      : comm_(std::move(transport), options),
        optimizer_(std::move(optimizer)),
        agent_(std::move(aggregation)),
        parameters_(std::move(parameters)),
        check_finite_(support::finite_check_from_env()) {
    const auto setup_began = clock::now();
    // Before anything else that communicates: ranks with different models fail here, all
    // of them, naming both models, not later in some collective (or never: a hang).
    // (A replacement of a lost worker joins a running job: the others checked long ago.)
    if (!concepts::rejoined(comm_.transport())) {
      std::vector<shape> shapes;
      shapes.reserve(parameters_.size());
      for (const auto& p : parameters_) shapes.push_back(p.shape());
      collective::check_same_model(comm_, dtype_of_v<value_type>, shapes);
    }
    if constexpr (on_device)
      if (check_finite_) refuse_finite_check_on_device();
    param_spans_.reserve(parameters_.size());
    grad_spans_.reserve(parameters_.size());
    marks_.assign(parameters_.size(), mark::none);
    if constexpr (on_device) {
      if constexpr (concepts::state_synchronising_agent<agent_type, value_type, Transport,
                                                        typename detail::host_state_of<Optimizer, value_type>::state_type>)
        if (agent_.averages_optimizer_state())
          throw error(errc::invalid_argument,
                      "gradwire::strategy: average_optimizer_state() is not available for CUDA tensors yet (the "
                      "optimizer state lives on the device); leave it off");
      // The aggregation sees pinned host mirrors; setup may overwrite them (a broadcast).
      device_.init(std::span<Tensor>(parameters_), optimizer_);
      for (std::size_t i = 0; i < parameters_.size(); ++i) param_spans_.push_back(device_.host_parameters(i));
      device_.download_parameters();
      agent_.setup(comm_, params());
      device_.upload_parameters();
    } else {
      states_.reserve(parameters_.size());
      for (auto& p : parameters_) {
        states_.push_back(optimizer_.template init<value_type>(p.size()));
        param_spans_.emplace_back(p.data(), p.size());
      }
      agent_.setup(comm_, params());
    }
    last_step_end_ = clock::now();
    if (observe::log_enabled(observe::log_level::info)) log_setup(last_step_end_ - setup_began);
  }

  // Move-only (the communicator is), and not while a step is in progress (its
  // pending_step points here); a worker of a parameter-server job tells the servers it
  // has finished, so that they stop waiting for it.
  strategy(strategy&&) = default;
  strategy& operator=(strategy&&) = default;
  ~strategy() {
    if constexpr (concepts::finishing_agent<agent_type, Transport>)
      if (std::uncaught_exceptions() == 0) try {
          agent_.finish(comm_);
        } catch (...) {  // a destructor must not throw; the servers then see the connection close
        }
  }

  // A job of one replica needs no transport argument.
  strategy(std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(), Aggregation aggregation = Aggregation())
    requires std::is_default_constructible_v<Transport>
      : strategy(Transport(), std::move(parameters), std::move(optimizer), std::move(aggregation)) {}

  // The incremental step, for communication that overlaps the backward pass:
  //   auto step = strategy.begin_step();
  //   step.ready(i, grad_i);   // as backward produces each gradient (any order)
  //   step.unused(i);          // a tensor with no gradient this step: zero, on this rank
  //   step.finish();           // waits, applies the update; every replica then agrees
  // ready() may be called from any thread (calls are serialised); grad_i must stay valid
  // and unchanged until finish() returns. One step at a time. A handle dropped before
  // finish() gives the step up (and the gradients accumulated by no_sync steps with it);
  // in a job of several ranks, once any gradient was handed over, later steps then fail
  // with errc::mismatch (communication may have started: the ranks are out of step).
  // begin_step(no_sync): a micro-batch; its gradients are only accumulated.
  pending_step begin_step() { return open_step(false); }
  pending_step begin_step(no_sync_t) { return open_step(true); }

  // The one-call step: takes this replica's gradients (one per parameter tensor, same
  // sizes and order) and updates the parameters; on return every replica holds the same
  // parameters. Gradient: a tensor, or anything a std::span<const value_type> can view.
  // With no_sync, the gradients are only accumulated (see no_sync_t).
  template <class Gradient>
    requires concepts::tensor<std::remove_const_t<Gradient>> ||
             requires(const Gradient& g) { std::span<const value_type>(g); }
  void step(std::span<Gradient> gradients) {
    one_call_step(gradients, false);
  }
  template <class Gradient>
    requires concepts::tensor<std::remove_const_t<Gradient>> ||
             requires(const Gradient& g) { std::span<const value_type>(g); }
  void step(std::span<Gradient> gradients, no_sync_t) {
    one_call_step(gradients, true);
  }
  template <class Gradient>
  void step(const std::vector<Gradient>& gradients) {
    step(std::span<const Gradient>(gradients));
  }
  template <class Gradient>
  void step(const std::vector<Gradient>& gradients, no_sync_t) {
    step(std::span<const Gradient>(gradients), no_sync);
  }

  // Check every gradient for NaN and infinity at step() / step.ready() (off by default;
  // GRADWIRE_CHECK_FINITE=1 turns it on for every strategy). A rank that finds one throws
  // errc::invalid_argument naming the gradient and the element, and fails its transport
  // with that report so that every other rank gets errc::peer_lost carrying it instead
  // of waiting (support/finite_check.hpp). Every step then costs one read of the
  // gradients (benchmarks/finite_check). Host tensors only for now.
  void check_finite_gradients(bool on) {
    if constexpr (on_device)
      if (on) refuse_finite_check_on_device();
    check_finite_ = on;
  }
  bool checks_finite_gradients() const noexcept { return check_finite_; }

  // Micro-batches accumulated since the last synchronised step.
  std::size_t accumulated_micro_batches() const noexcept { return accumulated_; }

  // Parameter servers: a server rank calls serve() instead of step(); it returns what the
  // server saw once every worker has finished (or was lost, in async modes).
  bool is_server() const {
    if constexpr (requires(const agent_type& a) { { a.is_server(0, 1) } -> std::convertible_to<bool>; })
      return agent_.is_server(comm_.rank(), comm_.size());
    else
      return false;
  }
  auto serve()
    requires concepts::serving_agent<agent_type, value_type, Transport, Optimizer>
  {
    if constexpr (on_device) {
      // A server keeps its shard and its optimizer state on the host; the tensors get the
      // final values back.
      device_.download_parameters();
      auto result = agent_.serve(comm_, params(), optimizer_);
      device_.upload_parameters();
      return result;
    } else {
      return agent_.serve(comm_, params(), optimizer_);
    }
  }

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  std::span<Tensor> parameters() noexcept { return parameters_; }
  std::span<const Tensor> parameters() const noexcept { return parameters_; }
  Optimizer& optimizer() noexcept { return optimizer_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  // One state per parameter tensor, in the same order: what a checkpoint saves and restores.
  std::span<optimizer_state_type> optimizer_states() noexcept {
    if constexpr (on_device)
      return device_.states();
    else
      return states_;
  }
  std::span<const optimizer_state_type> optimizer_states() const noexcept {
    if constexpr (on_device)
      return device_.states();
    else
      return states_;
  }
  communicator_type& communicator() noexcept { return comm_; }

  // What the latest step cost this rank (bytes, communication vs optimizer vs the
  // caller's compute, staleness), and the same added up over every step so far. With the
  // incremental API, time in the step is what finish() took: communication hidden behind
  // backward (before finish) counts as compute.
  const observe::step_stats& last_step_stats() const noexcept { return last_step_; }
  const observe::step_stats& cumulative_stats() const noexcept { return cumulative_; }

  // The aggregation's agent: its settings and this job's state (for a whole-step
  // aggregation, the object the strategy was given).
  decltype(auto) aggregation() noexcept {
    if constexpr (aggregation::is_whole_step_v<Aggregation, value_type, Transport>)
      return (agent_.aggregation());
    else
      return (agent_);
  }
  decltype(auto) aggregation() const noexcept {
    if constexpr (aggregation::is_whole_step_v<Aggregation, value_type, Transport>)
      return (agent_.aggregation());
    else
      return (agent_);
  }

 private:
  using clock = support::step_clock;  // virtual time on a simulated rank
  enum class mark : std::uint8_t { none, ready, unused };

  std::span<const std::span<value_type>> params() const noexcept { return param_spans_; }

  template <class Gradient>
  void one_call_step(std::span<Gradient> gradients, bool local_only) {
    if (gradients.size() != parameters_.size())
      throw error(errc::invalid_argument, "strategy::step: got " + std::to_string(gradients.size()) +
                                              " gradient tensors for " + std::to_string(parameters_.size()) +
                                              " parameter tensors");
    for (std::size_t i = 0; i < gradients.size(); ++i) check_gradient_size("strategy::step: gradient ", i, gradients[i]);
    if constexpr (on_device) {
      static_assert(concepts::tensor<std::remove_const_t<Gradient>>,
                    "strategy::step: the parameters are CUDA tensors, so the gradients must be CUDA tensors too "
                    "(cuda_tensor or cuda_tensor_view)");
      if (local_only)
        throw error(errc::invalid_argument, "strategy::step(grads, no_sync): gradient accumulation is not "
                                            "available for CUDA tensors yet; accumulate on the device and step once");
      const auto began = clock::now();
      const auto traffic_before = traffic();
      auto trace = comm_.trace("step", 0, "strategy");
      trace.arg("step", static_cast<std::int64_t>(cumulative_.steps + 1));
      observe::current_step().store(cumulative_.steps + 1, std::memory_order_relaxed);
      optimizer_time_ = {};
      device_step(gradients);
      finish_step_stats(began, traffic_before);
      trace.bytes(last_step_.traffic.bytes_sent);
    } else {
      auto step = open_step(local_only);
      // Backward produces the last tensors' gradients first: hand them over in that order.
      for (std::size_t i = gradients.size(); i-- > 0;) step.ready(i, gradients[i]);
      step.finish();
    }
  }

  pending_step open_step(bool local_only) {
    static_assert(!on_device,
                  "strategy::begin_step: the incremental step takes host tensors for now; with CUDA tensors call "
                  "step(grads)");
    if (step_open_)
      throw error(errc::invalid_argument, "strategy::begin_step: a step is already in progress on rank " +
                                              std::to_string(rank()) + " (finish() it, or drop its handle, first)");
    if (is_server())
      throw error(errc::invalid_argument, "strategy::begin_step: rank " + std::to_string(rank()) +
                                              " is a server: call serve() on it instead of stepping (it is one of the parameter servers)");
    if (!out_of_step_.empty()) throw error(errc::mismatch, out_of_step_);
    // First, so that what a given-up step left in flight is done before anything here
    // reads the transport (its counters) or the agent's buffers.
    if (!local_only) agent_.begin_step(comm_);
    step_open_ = true;
    finishing_ = false;
    no_sync_ = local_only;
    std::fill(marks_.begin(), marks_.end(), mark::none);
    marked_ = 0;
    support::step_began();
    step_began_ = clock::now();
    traffic_before_ = traffic();
    step_trace_.open(comm_.trace(local_only ? "micro_batch" : "step", 0, "strategy"))
        .arg("step", static_cast<std::int64_t>(cumulative_.steps + 1));
    observe::current_step().store(cumulative_.steps + 1, std::memory_order_relaxed);  // for stall reports
    optimizer_time_ = {};
    return pending_step(this);
  }

  template <class Gradient>
  void check_gradient_size(const char* who, std::size_t i, const Gradient& g) const {
    const std::size_t n = element_count(g);
    if (n != parameters_[i].size())
      throw error(errc::invalid_argument, who + std::to_string(i) + " has " + std::to_string(n) +
                                              " elements but parameter " + std::to_string(i) + " has " +
                                              std::to_string(parameters_[i].size()));
  }

  std::string describe(std::size_t i) const {
    return "gradient " + std::to_string(i) + " (parameter of shape " + parameters_[i].shape().to_string() + ")";
  }

  // step.ready / step.unused: gradient i is final for this step.
  void mark_ready(std::size_t i, std::span<const value_type> grad, mark how) {
    if (i >= parameters_.size())
      throw error(errc::invalid_argument, "strategy: step." + std::string(how == mark::unused ? "unused" : "ready") +
                                              "(" + std::to_string(i) + "): the model has " +
                                              std::to_string(parameters_.size()) + " parameter tensors");
    if (how == mark::ready) check_gradient_size("strategy: step.ready: gradient ", i, grad);
    if (how == mark::ready && check_finite_) check_finite(i, grad);
    std::lock_guard lock(ready_mutex_.mutex);
    if (finishing_)
      throw error(errc::invalid_argument, "strategy: step." + std::string(how == mark::unused ? "unused" : "ready") +
                                              "(" + std::to_string(i) + ") after finish() was called for this step");
    if (marks_[i] != mark::none)
      throw error(errc::invalid_argument,
                  "strategy: " + describe(i) + " was marked " + (marks_[i] == mark::unused ? "unused" : "ready") +
                      " twice in this step (each tensor is marked once per step, by step.ready or step.unused)");
    marks_[i] = how;
    ++marked_;
    if (how == mark::unused) grad = zeros(i);
    if (no_sync_) {
      accumulate(i, grad);
      return;
    }
    if (accumulated_ > 0) grad = fold_accumulated(i, grad);
    agent_.ready(comm_, i, grad);
  }

  // A gradient with a NaN or infinity: tell the other ranks (they would wait for it),
  // then throw. This rank's transport is failed from here on.
  void check_finite(std::size_t i, std::span<const value_type> grad) {
    const auto report = support::non_finite_report(rank(), i, parameters_[i].shape(), grad);
    if (!report) return;
    if constexpr (concepts::failable_transport<Transport>)
      if (comm_.size() > 1) comm_.transport().fail(errc::invalid_argument, *report);
    throw error(errc::invalid_argument, *report);
  }
  [[noreturn]] static void refuse_finite_check_on_device() {
    throw error(errc::invalid_argument,
                "gradwire::strategy: the non-finite gradient check (check_finite_gradients, GRADWIRE_CHECK_FINITE) is "
                "not available for CUDA tensors yet; leave it off");
  }

  // step.finish(): every tensor marked? then the aggregation completes the step.
  void finish_open_step() {
    struct closer {
      strategy* s;
      ~closer() { s->close_step(); }
    } close_on_exit{this};
    {
      std::lock_guard lock(ready_mutex_.mutex);  // a late ready() from another thread is refused from here on
      finishing_ = true;
    }
    if (marked_ != parameters_.size()) {
      std::string missing;
      std::size_t count = 0;
      for (std::size_t i = 0; i < marks_.size(); ++i)
        if (marks_[i] == mark::none && count++ < 4) missing += (missing.empty() ? "" : ", ") + describe(i);
      if (count > 4) missing += " and " + std::to_string(count - 4) + " more";
      discard_accumulated();
      if (!no_sync_ && marked_ > 0) fall_out_of_step("a step finished with gradients missing");
      throw error(errc::invalid_argument,
                  "strategy: step.finish() on rank " + std::to_string(rank()) + ": " + missing +
                      " never marked ready in this step; call step.ready(i, grad) once backward has produced it, or "
                      "step.unused(i) for a parameter this step does not use (it then counts as a zero gradient)");
    }
    const auto began = clock::now();
    if (no_sync_) {
      ++accumulated_;
    } else {
      accumulated_ = 0;  // folded into this step's gradients by ready()
      try {
        agent_.finish_step(comm_, params(),
                           [this](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
                             timed_optimizer(i, grad.size_bytes(),
                                             [&] { optimizer_.step(states_[i], param_spans_[i], grad, grad_scale); });
                           });
      } catch (...) {
        fall_out_of_step("a step failed in finish() (some of its update may be applied here only)");
        throw;
      }
      // An aggregation that keeps replicas' optimizer state in step too (local SGD's
      // average_optimizer_state) gets it after the update (host tensors only so far).
      if constexpr (concepts::state_synchronising_agent<agent_type, value_type, Transport, optimizer_state_type>)
        agent_.template synchronise_state<value_type>(comm_, std::span<optimizer_state_type>(states_));
    }
    finish_step_stats(began, traffic_before_);
    step_trace_.bytes(last_step_.traffic.bytes_sent);
  }

  // A step ends: finished, failed, or its handle dropped before finish().
  void close_step() noexcept {
    step_open_ = false;
    step_trace_.reset();
  }
  void abandon_step() noexcept {
    discard_accumulated();
    if (!no_sync_ && marked_ > 0) fall_out_of_step("a step was dropped after some of its gradients were handed over");
    close_step();
  }

  // After a step given up midway, this rank's collectives may no longer pair up with the
  // others' (the same ones, in the same order): refuse further steps rather than mix up
  // gradients silently. One rank alone cannot fall out of step.
  void fall_out_of_step(const char* what) noexcept {
    if (comm_.size() == 1 || !out_of_step_.empty()) return;
    try {
      out_of_step_ = "strategy: rank " + std::to_string(rank()) + " cannot step with the other ranks any more: " + what +
                     ", so its communication may no longer line up with theirs; restart the job (from a checkpoint)";
    } catch (...) {
      out_of_step_ = "strategy: this rank is out of step with the others; restart the job";
    }
  }

  // Gradient accumulation: the running sum of this round's micro-batches, per tensor.
  std::span<value_type> accumulated(std::size_t i) {
    if (accumulated_grads_.size() == 0) {
      accumulation_layout_ = flat_layout::of(parameters_);
      accumulated_grads_.reserve_discard(accumulation_layout_.total());
    }
    const std::span<value_type> all(accumulated_grads_.data(), accumulation_layout_.total());
    return accumulation_layout_.slice(all, i);
  }
  void accumulate(std::size_t i, std::span<const value_type> grad) {
    const std::span<value_type> sum = accumulated(i);
    if (accumulated_ == 0)
      std::copy(grad.begin(), grad.end(), sum.begin());
    else
      for (std::size_t k = 0; k < grad.size(); ++k) sum[k] += grad[k];
  }
  // The synchronised step after K micro-batches: the mean of the K + 1 gradients.
  std::span<const value_type> fold_accumulated(std::size_t i, std::span<const value_type> grad) {
    const std::span<value_type> sum = accumulated(i);
    const value_type scale = value_type(1) / static_cast<value_type>(accumulated_ + 1);
    for (std::size_t k = 0; k < grad.size(); ++k) sum[k] = (sum[k] + grad[k]) * scale;
    return sum;
  }
  void discard_accumulated() noexcept { accumulated_ = 0; }

  // The gradient of a tensor marked unused: zeros, allocated once for the largest tensor.
  std::span<const value_type> zeros(std::size_t i) {
    if (zeros_.empty()) {
      std::size_t largest = 1;
      for (const auto& p : parameters_) largest = std::max(largest, p.size());
      zeros_.assign(largest, value_type(0));
    }
    return {zeros_.data(), parameters_[i].size()};
  }

  // The device path (gradwire/cuda/device_replica.cuh): gradients staged to the host only
  // when the aggregation will read them, the optimizer on the device.
  template <class Gradient>
  void device_step(std::span<Gradient> gradients) {
    if (device_.step_in_device_memory(agent_, comm_, gradients, optimizer_)) return;
    constexpr bool apply_only = concepts::updates_only_through_apply<agent_type>;
    device_.stage_gradients(gradients, apply_only && comm_.size() == 1, grad_spans_);
    agent_.begin_step(comm_);
    for (std::size_t i = grad_spans_.size(); i-- > 0;) agent_.ready(comm_, i, grad_spans_[i]);
    agent_.finish_step(comm_, params(), [this](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
      timed_optimizer(i, grad.size_bytes(), [&] { device_.apply(optimizer_, i, grad, grad_scale, !apply_only); });
    });
    device_.finish_step(!apply_only);
  }

  // Runs the optimizer on tensor i: timed for the step's stats, traced on the timeline.
  template <class F>
  void timed_optimizer(std::size_t i, std::size_t bytes, F&& run) {
    auto trace = comm_.trace("optimizer_step", bytes, "optimizer");
    trace.arg("tensor", static_cast<std::int64_t>(i));
    const auto began = clock::now();
    run();
    optimizer_time_ += clock::now() - began;
  }

  support::traffic_counters traffic() const {
    if constexpr (concepts::metered_transport<Transport>)
      return comm_.transport().traffic();
    else
      return {};
  }

  void finish_step_stats(clock::time_point began, const support::traffic_counters& traffic_before) {
    const auto ended = clock::now();
    last_step_ = {};
    last_step_.steps = 1;
    last_step_.traffic = traffic() - traffic_before;
    last_step_.traffic_measured = concepts::metered_transport<Transport>;
    last_step_.in_step = ended - began;
    last_step_.optimizer = optimizer_time_;
    last_step_.compute = began - last_step_end_;
    if constexpr (concepts::staleness_reporting_agent<agent_type>) last_step_.staleness = agent_.last_staleness();
    cumulative_ += last_step_;
    last_step_end_ = ended;
    if (observe::log_enabled(observe::log_level::debug))
      observe::log_debug(rank(), size(), "step ", cumulative_.steps, ": ", observe::to_string(last_step_));
  }

  void log_setup(clock::duration took) {
    std::size_t elements = 0;
    for (const auto& p : parameters_) elements += p.size();
    observe::log_info(rank(), size(), "strategy ready in ",
                      std::chrono::duration<double, std::milli>(took).count(), " ms: ",
                      observe::type_name<Aggregation>(), ", ", parameters_.size(), " tensor(s), ", elements,
                      " elements (", elements * sizeof(value_type), " bytes)",
                      on_device ? ", on the CUDA device" : "", is_server() ? "; this rank serves" : "");
  }

  template <class Gradient>
  static std::size_t element_count(const Gradient& g) {
    if constexpr (concepts::tensor<std::remove_const_t<Gradient>>)
      return g.size();
    else
      return std::span<const value_type>(g).size();
  }

  template <class Gradient>
  static std::span<const value_type> as_span(const Gradient& g) {
    if constexpr (concepts::tensor<std::remove_const_t<Gradient>>)
      return {g.data(), g.size()};
    else
      return std::span<const value_type>(g);
  }

  communicator_type comm_;
  Optimizer optimizer_;
  agent_type agent_;
  std::vector<Tensor> parameters_;
  std::vector<typename detail::host_state_of<Optimizer, value_type>::state_type> states_;  // host tensors only
  [[no_unique_address]] device_replica_type device_;                                       // CUDA tensors only
  std::vector<std::span<value_type>> param_spans_;
  std::vector<std::span<const value_type>> grad_spans_;  // reused across steps (device path)
  // The step in progress.
  detail::movable_mutex ready_mutex_;  // ready() may come from several threads
  std::vector<mark> marks_;
  std::size_t marked_ = 0;
  bool step_open_ = false, no_sync_ = false;
  bool finishing_ = false;   // finish() has begun: ready() is refused
  std::string out_of_step_;  // why this rank can take no more steps (empty: it can)
  bool check_finite_ = false;  // check_finite_gradients
  clock::time_point step_began_;
  support::traffic_counters traffic_before_;
  detail::step_trace step_trace_;
  // Gradient accumulation (no_sync steps) and the zeros an unused tensor contributes.
  std::size_t accumulated_ = 0;
  flat_layout accumulation_layout_;
  aligned_buffer<value_type> accumulated_grads_;
  std::vector<value_type> zeros_;
  observe::step_stats last_step_, cumulative_;
  clock::time_point last_step_end_;
  clock::duration optimizer_time_{};

 public:
  // The handle of a step in progress (begin_step()). Move-only; dropping it before
  // finish() gives the step up.
  class pending_step {
   public:
    pending_step(pending_step&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    pending_step& operator=(pending_step&&) = delete;
    ~pending_step() {
      if (owner_) owner_->abandon_step();
    }

    // Gradient i is final for this step (a tensor, or anything std::span<const value_type>
    // can view); it must stay valid and unchanged until finish() returns.
    template <class Gradient>
      requires concepts::tensor<std::remove_const_t<Gradient>> ||
               requires(const Gradient& g) { std::span<const value_type>(g); }
    pending_step& ready(std::size_t i, const Gradient& gradient) {
      owner("ready")->mark_ready(i, as_span(gradient), mark::ready);
      return *this;
    }
    // Tensor i gets no gradient from this replica this step: it counts as zeros.
    pending_step& unused(std::size_t i) {
      owner("unused")->mark_ready(i, {}, mark::unused);
      return *this;
    }
    // Waits for the communication, applies the update, ends the step.
    void finish() {
      strategy* s = owner("finish");
      owner_ = nullptr;
      s->finish_open_step();
    }

   private:
    friend class strategy;
    explicit pending_step(strategy* owner) noexcept : owner_(owner) {}
    strategy* owner(const char* what) const {
      if (!owner_)
        throw error(errc::invalid_argument,
                    std::string("strategy: step.") + what + "() on a step that has finished (call begin_step() again)");
      return owner_;
    }
    strategy* owner_;
  };
};

}  // namespace gradwire
