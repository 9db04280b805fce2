// strategy<Tensor, Optimizer, Aggregation, Transport>: one replica's view of data-parallel training.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "aggregation/all_reduce.hpp"
#include "aggregation/averaging.hpp"
#include "aggregation/central.hpp"
#include "aggregation/local.hpp"
#include "aggregation/parameter_server.hpp"
#include "collective/communicator.hpp"
#include "concepts.hpp"
#include "error.hpp"
#include "observe/log.hpp"
#include "observe/step_stats.hpp"
#include "observe/timeline.hpp"
#include "observe/type_name.hpp"
#include "tensor/host_tensor.hpp"
#include "transport/inproc.hpp"
#include "transport/local.hpp"

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
template <class Optimizer, class V>
struct host_state_of {
  using state_type = typename Optimizer::template state<V>;
};

// Aggregations that change parameters only by calling apply() (all-reduce, local) say so
// with `static constexpr bool updates_only_through_apply = true`; a device replica then
// skips copying parameters to and from the host around their step.
template <class A>
constexpr bool updates_only_through_apply() {
  if constexpr (requires { A::updates_only_through_apply; })
    return A::updates_only_through_apply;
  else
    return false;
}
}  // namespace detail

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
                "gradwire::strategy: Aggregation does not satisfy gradwire::concepts::aggregation: it needs setup(comm, "
                "params) and step(comm, params, grads, apply) (see gradwire/concepts.hpp)");

 public:
  using tensor_type = Tensor;
  using optimizer_type = Optimizer;
  using aggregation_type = Aggregation;
  using transport_type = Transport;
  using value_type = typename Tensor::value_type;
  using communicator_type = collective::communicator<Transport>;
  static constexpr bool on_device = Tensor::location == memory_location::cuda;
  using device_replica_type =
      std::conditional_t<on_device, detail::device_replica<Tensor, Optimizer>, detail::no_device_replica>;
  // Host tensors: the optimizer's state<V>; CUDA tensors: optim::device_state<Optimizer, V>.
  using optimizer_state_type = typename std::conditional_t<on_device, device_replica_type,
                                                           detail::host_state_of<Optimizer, value_type>>::state_type;

  // Joins the replicas reachable through `transport` and makes their parameters equal
  // (the aggregation's setup, e.g. a broadcast from rank 0). Collective: every replica
  // constructs its strategy with tensors of the same shapes, in the same order.
  strategy(Transport transport, std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(),
           Aggregation aggregation = Aggregation(), collective::communicator_options options = {})
      : comm_(std::move(transport), options),
        optimizer_(std::move(optimizer)),
        aggregation_(std::move(aggregation)),
        parameters_(std::move(parameters)) {
    const auto setup_began = clock::now();
    param_spans_.reserve(parameters_.size());
    grad_spans_.reserve(parameters_.size());
    if constexpr (on_device) {
      if constexpr (requires { aggregation_.averages_optimizer_state(); })
        if (aggregation_.averages_optimizer_state())
          throw error(errc::invalid_argument,
                      "gradwire::strategy: average_optimizer_state() is not available for CUDA tensors yet (the "
                      "optimizer state lives on the device); leave it off");
      // The aggregation sees pinned host mirrors; setup may overwrite them (a broadcast).
      device_.init(std::span<Tensor>(parameters_), optimizer_);
      for (std::size_t i = 0; i < parameters_.size(); ++i) param_spans_.push_back(device_.host_parameters(i));
      device_.download_parameters();
      aggregation_.setup(comm_, std::span<const std::span<value_type>>(param_spans_));
      device_.upload_parameters();
    } else {
      states_.reserve(parameters_.size());
      for (auto& p : parameters_) {
        states_.push_back(optimizer_.template init<value_type>(p.size()));
        param_spans_.emplace_back(p.data(), p.size());
      }
      aggregation_.setup(comm_, std::span<const std::span<value_type>>(param_spans_));
    }
    last_step_end_ = clock::now();
    if (observe::log_enabled(observe::log_level::info)) log_setup(last_step_end_ - setup_began);
  }

  // Move-only (the communicator is); a worker of a parameter-server job tells the
  // servers it has finished, so that they stop waiting for it.
  strategy(strategy&&) = default;
  strategy& operator=(strategy&&) = default;
  ~strategy() {
    if constexpr (requires { aggregation_.finish(comm_); })
      if (std::uncaught_exceptions() == 0) try {
          aggregation_.finish(comm_);
        } catch (...) {  // a destructor must not throw; the servers then see the connection close
        }
  }

  // A job of one replica needs no transport argument.
  strategy(std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(), Aggregation aggregation = Aggregation())
    requires std::is_default_constructible_v<Transport>
      : strategy(Transport(), std::move(parameters), std::move(optimizer), std::move(aggregation)) {}

  // Takes this replica's gradients (one per parameter tensor, same sizes and order) and
  // updates the parameters; on return every replica holds the same parameters.
  // Gradient: a tensor, or anything a std::span<const value_type> can view (std::vector).
  template <class Gradient>
    requires concepts::tensor<std::remove_const_t<Gradient>> ||
             requires(const Gradient& g) { std::span<const value_type>(g); }
  void step(std::span<Gradient> gradients) {
    if (gradients.size() != parameters_.size())
      throw error(errc::invalid_argument, "strategy::step: got " + std::to_string(gradients.size()) +
                                              " gradient tensors for " + std::to_string(parameters_.size()) +
                                              " parameter tensors");
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      const std::size_t n = element_count(gradients[i]);
      if (n != parameters_[i].size())
        throw error(errc::invalid_argument, "strategy::step: gradient " + std::to_string(i) + " has " +
                                                std::to_string(n) + " elements but parameter " + std::to_string(i) +
                                                " has " + std::to_string(parameters_[i].size()));
    }
    const auto began = clock::now();
    const auto traffic_before = traffic();
    auto trace = comm_.trace("step", 0, "strategy");
    trace.arg("step", static_cast<std::int64_t>(cumulative_.steps + 1));
    observe::current_step().store(cumulative_.steps + 1, std::memory_order_relaxed);  // for stall reports
    optimizer_time_ = {};
    if constexpr (on_device) {
      static_assert(concepts::tensor<std::remove_const_t<Gradient>>,
                    "strategy::step: the parameters are CUDA tensors, so the gradients must be CUDA tensors too "
                    "(cuda_tensor or cuda_tensor_view)");
      device_step(gradients);
    } else {
      grad_spans_.clear();
      for (std::size_t i = 0; i < gradients.size(); ++i) grad_spans_.push_back(as_span(gradients[i]));
      aggregation_.step(comm_, std::span<const std::span<value_type>>(param_spans_),
                        std::span<const std::span<const value_type>>(grad_spans_),
                        [this](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
                          timed_optimizer(i, grad.size_bytes(),
                                          [&] { optimizer_.step(states_[i], param_spans_[i], grad, grad_scale); });
                        });
      // An aggregation that keeps replicas' optimizer state in step too (local SGD's
      // average_optimizer_state) gets it after the update (host tensors only so far).
      if constexpr (requires { aggregation_.template synchronise_state<value_type>(comm_, std::span(states_)); })
        aggregation_.template synchronise_state<value_type>(comm_, std::span(states_));
    }
    finish_step_stats(began, traffic_before);
    trace.bytes(last_step_.traffic.bytes_sent);
  }
  template <class Gradient>
  void step(const std::vector<Gradient>& gradients) {
    step(std::span<const Gradient>(gradients));
  }

  // Parameter servers: a server rank calls serve() instead of step(); it returns what the
  // server saw once every worker has finished (or was lost, in async modes).
  bool is_server() const {
    if constexpr (requires { aggregation_.is_server(0, 1); })
      return aggregation_.is_server(comm_.rank(), comm_.size());
    else
      return false;
  }
  auto serve()
    requires requires(Aggregation& a, communicator_type& c, const Optimizer& o) {
      a.serve(c, std::span<const std::span<value_type>>(), o);
    }
  {
    if constexpr (on_device) {
      // A server keeps its shard and its optimizer state on the host; the tensors get the
      // final values back.
      device_.download_parameters();
      auto result = aggregation_.serve(comm_, std::span<const std::span<value_type>>(param_spans_), optimizer_);
      device_.upload_parameters();
      return result;
    } else {
      return aggregation_.serve(comm_, std::span<const std::span<value_type>>(param_spans_), optimizer_);
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

  // What the latest step() cost this rank (bytes, communication vs optimizer vs the
  // caller's compute, staleness), and the same added up over every step so far.
  const observe::step_stats& last_step_stats() const noexcept { return last_step_; }
  const observe::step_stats& cumulative_stats() const noexcept { return cumulative_; }
  Aggregation& aggregation() noexcept { return aggregation_; }
  const Aggregation& aggregation() const noexcept { return aggregation_; }

 private:
  // The device path (gradwire/cuda/device_replica.cuh): gradients staged to the host only
  // when the aggregation will read them, the optimizer on the device.
  template <class Gradient>
  void device_step(std::span<Gradient> gradients) {
    if (device_.step_in_device_memory(aggregation_, comm_, gradients, optimizer_)) return;
    constexpr bool apply_only = detail::updates_only_through_apply<Aggregation>();
    device_.stage_gradients(gradients, apply_only && comm_.size() == 1, grad_spans_);
    aggregation_.step(comm_, std::span<const std::span<value_type>>(param_spans_),
                      std::span<const std::span<const value_type>>(grad_spans_),
                      [this](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
                        timed_optimizer(i, grad.size_bytes(),
                                        [&] { device_.apply(optimizer_, i, grad, grad_scale, !apply_only); });
                      });
    device_.finish_step(!apply_only);
  }

  using clock = std::chrono::steady_clock;

  // Runs the optimizer on tensor i: timed for the step's stats, traced on the timeline.
  template <class F>
  void timed_optimizer(std::size_t i, std::size_t bytes, F&& run) {
    auto trace = comm_.trace("optimizer_step", bytes, "optimizer");
    trace.arg("tensor", static_cast<std::int64_t>(i));
    const auto began = clock::now();
    run();
    optimizer_time_ += clock::now() - began;
  }

  transport::traffic_counters traffic() const {
    if constexpr (concepts::metered_transport<Transport>)
      return comm_.transport().traffic();
    else
      return {};
  }

  void finish_step_stats(clock::time_point began, const transport::traffic_counters& traffic_before) {
    const auto ended = clock::now();
    last_step_ = {};
    last_step_.steps = 1;
    last_step_.traffic = traffic() - traffic_before;
    last_step_.traffic_measured = concepts::metered_transport<Transport>;
    last_step_.in_step = ended - began;
    last_step_.optimizer = optimizer_time_;
    last_step_.compute = began - last_step_end_;
    if constexpr (requires { aggregation_.last_staleness(); }) last_step_.staleness = aggregation_.last_staleness();
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
  Aggregation aggregation_;
  std::vector<Tensor> parameters_;
  std::vector<typename detail::host_state_of<Optimizer, value_type>::state_type> states_;  // host tensors only
  [[no_unique_address]] device_replica_type device_;                                       // CUDA tensors only
  std::vector<std::span<value_type>> param_spans_;
  std::vector<std::span<const value_type>> grad_spans_;  // reused across steps
  observe::step_stats last_step_, cumulative_;
  clock::time_point last_step_end_;
  clock::duration optimizer_time_{};
};

// OneDeviceStrategy: a single replica, no communication.
template <class Tensor, class Optimizer>
using one_device = strategy<Tensor, Optimizer, aggregation::local, transport::local>;

// MirroredStrategy: one replica per thread in this process, synchronous all-reduce.
template <class Tensor, class Optimizer>
using mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::inproc>;

// CentralStorageStrategy: one owner rank holds the variables and applies the optimizer.
template <class Tensor, class Optimizer, class Transport = transport::inproc>
using central_storage = strategy<Tensor, Optimizer, aggregation::central, Transport>;

// Local SGD / model averaging: each replica steps on its own gradient and the replicas
// average their parameters every H steps (H >= 1). H = 1 with plain SGD (or momentum)
// equals mirrored up to float rounding; optimizer state stays per replica, so Adam does not.
template <class Tensor, class Optimizer, int H, class Transport = transport::inproc>
using local_sgd = strategy<Tensor, Optimizer, aggregation::averaging<H>, Transport>;

// ParameterServerStrategy: variables sharded over the last ps::options::servers ranks;
// Mode is ps::sync, ps::async, ps::bounded_staleness<s> or ps::backup_workers<b>.
template <class Tensor, class Optimizer, class Mode, class Transport = transport::inproc>
using parameter_server = strategy<Tensor, Optimizer, aggregation::parameter_server<Mode>, Transport>;

}  // namespace gradwire
