// strategy<Tensor, Optimizer, Aggregation, Transport>: one replica's view of data-parallel training.
//
// The template alone: it includes no aggregation and no transport (a translation unit
// names the ones it uses). The named combinations (mirrored, one_device, ...) are in
// gradwire/strategies/, one header each, and all of them in gradwire/strategies.hpp.
// Its parts are in training/: the replica that holds the tensors and the optimizer state
// (host, or a CUDA device), the step session, gradient accumulation and the step meter.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
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
#include "observe/log.hpp"
#include "observe/step_stats.hpp"
#include "tensor/dtype.hpp"
#include "tensor/shape.hpp"
#include "training/accumulation.hpp"
#include "training/finite_check.hpp"
#include "training/replica.hpp"
#include "training/step_meter.hpp"
#include "training/step_session.hpp"

namespace gradwire {

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
  // Where the tensors and the optimizer state live (concepts::replica): training::host_replica,
  // or for CUDA tensors the device replica of gradwire/cuda/device_replica.cuh.
  using replica_type = training::replica_t<Tensor, Optimizer>;
  // Host tensors: the optimizer's state<V>; CUDA tensors: optim::device_state<Optimizer, V>.
  using optimizer_state_type = typename replica_type::state_type;
  // The handle of a step in progress (begin_step()); dropping it before finish() gives the step up.
  using pending_step = training::pending_step<strategy, value_type>;

  // Joins the replicas reachable through `transport` and makes their parameters equal
  // (the aggregation's setup, e.g. a broadcast from rank 0). Collective: every replica
  // constructs its strategy with tensors of the same shapes, in the same order.
  strategy(Transport transport, std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(),
           Aggregation aggregation = Aggregation(), collective::communicator_options options = {})
      : comm_(std::move(transport), options),
        optimizer_(std::move(optimizer)),
        agent_(std::move(aggregation)),
        parameters_(std::move(parameters)),
        session_(parameters_.size()),
        accumulation_(parameters_),
        check_finite_(training::finite_check_from_env()) {
    const auto setup_began = comm_.time().now();
    // Before anything else that communicates: ranks with different models fail here, all
    // of them, naming both models, not later in some collective (or never: a hang).
    // (A replacement of a lost worker joins a running job: the others checked long ago.)
    if (!concepts::rejoined(comm_.transport())) {
      std::vector<shape> shapes;
      shapes.reserve(parameters_.size());
      for (const auto& p : parameters_) shapes.push_back(p.shape());
      collective::check_same_model(comm_, dtype_of_v<value_type>, shapes);
    }
    check_finite_gradients(check_finite_);  // GRADWIRE_CHECK_FINITE=1: refused where the replica cannot check
    replica_.setup(agent_, comm_, std::span<Tensor>(parameters_), optimizer_);
    const auto took = meter_.setup_finished(comm_, setup_began);
    if (observe::log_enabled(observe::log_level::info))
      meter_.template log_setup<Aggregation>(comm_, took, parameters_, replica_type::where, is_server());
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
  // parameters. Gradient: a tensor, or anything a std::span<const value_type> can view
  // (concepts::gradient). With no_sync, the gradients are only accumulated (see no_sync_t).
  template <concepts::gradient<value_type> Gradient>
  void step(std::span<Gradient> gradients) {
    one_call_step(gradients, false);
  }
  template <concepts::gradient<value_type> Gradient>
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
  // of waiting (training/finite_check.hpp). Every step then costs one read of the
  // gradients (benchmarks/finite_check). Host tensors only for now (the check runs in
  // step.ready(), which only an incremental replica has).
  void check_finite_gradients(bool on) {
    if (on && !incremental)
      throw error(errc::invalid_argument,
                  "gradwire::strategy: the non-finite gradient check (check_finite_gradients, GRADWIRE_CHECK_FINITE) is "
                  "not available for CUDA tensors yet; leave it off");
    check_finite_ = on;
  }
  bool checks_finite_gradients() const noexcept { return check_finite_; }

  // Micro-batches accumulated since the last synchronised step.
  std::size_t accumulated_micro_batches() const noexcept { return accumulation_.micro_batches(); }

  // Parameter servers: a server rank calls serve() instead of step(); it returns what the
  // server saw once every worker has finished (or was lost, in async modes). With CUDA
  // tensors the server keeps its shard and optimizer state on the host; the tensors get
  // the final values back.
  bool is_server() const {
    if constexpr (concepts::server_choosing_agent<agent_type>)
      return agent_.is_server(comm_.rank(), comm_.size());
    else
      return false;
  }
  auto serve()
    requires concepts::serving_agent<agent_type, value_type, Transport, Optimizer>
  {
    return replica_.on_host([&] { return agent_.serve(comm_, replica_.parameters(), optimizer_); });
  }
  // The same, running a learning-rate schedule: before each update, lr = schedule(version,
  // gradients applied so far). The servers own the optimizer, so it needs set_lr(double)
  // (concepts::schedulable_optimizer): without it this does not compile, where a schedule
  // in ps::options::learning_rate is refused only when the server starts.
  template <std::invocable<std::uint64_t, std::uint64_t> Schedule>
  auto serve(Schedule schedule)
    requires concepts::serving_agent<agent_type, value_type, Transport, Optimizer>
  {
    static_assert(concepts::schedulable_optimizer<Optimizer>,
                  "gradwire::strategy::serve(schedule): Optimizer has no set_lr(double), so a learning-rate "
                  "schedule cannot set its rate (concepts::schedulable_optimizer); give it set_lr or serve() "
                  "without a schedule");
    static_assert(!concepts::schedulable_optimizer<Optimizer> ||
                      concepts::scheduling_agent<agent_type, value_type, Transport, Optimizer>,
                  "gradwire::strategy::serve(schedule): the aggregation's agent runs no learning-rate schedule "
                  "(concepts::scheduling_agent)");
    if constexpr (concepts::schedulable_optimizer<Optimizer>)
      return replica_.on_host([&] { return agent_.serve(comm_, replica_.parameters(), optimizer_, std::move(schedule)); });
    else
      return serve();  // not reached: the static_assert above stops the build
  }

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  std::span<Tensor> parameters() noexcept { return parameters_; }
  std::span<const Tensor> parameters() const noexcept { return parameters_; }
  Optimizer& optimizer() noexcept { return optimizer_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  // One state per parameter tensor, in the same order: what a checkpoint saves and restores.
  std::span<optimizer_state_type> optimizer_states() noexcept { return replica_.states(); }
  std::span<const optimizer_state_type> optimizer_states() const noexcept { return replica_.states(); }
  communicator_type& communicator() noexcept { return comm_; }
  // The time this rank runs on (clock.hpp): virtual on a simulated rank. Time a training
  // loop with it (time().now()) so that its figures agree with the step stats.
  time_source time() const { return comm_.time(); }

  // What the latest step cost this rank (bytes, communication vs optimizer vs the
  // caller's compute, staleness), and the same added up over every step so far. With the
  // incremental API, time in the step is what finish() took: communication hidden behind
  // backward (before finish) counts as compute.
  const observe::step_stats& last_step_stats() const noexcept { return meter_.last(); }
  const observe::step_stats& cumulative_stats() const noexcept { return meter_.cumulative(); }

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
  friend pending_step;
  using mark = training::mark;
  using session_type = training::step_session<Tensor>;
  // Host tensors: the incremental step, accumulation and the finite check; CUDA tensors:
  // the replica's own one-call step.
  static constexpr bool incremental = concepts::incremental_replica<replica_type, Tensor, Optimizer, Transport>;
  static_assert(concepts::replica<replica_type, Tensor, Optimizer, Transport>,
                "gradwire::strategy: the replica chosen for Tensor does not satisfy gradwire::concepts::replica (see "
                "gradwire/concepts.hpp)");

  template <class Gradient>
  void one_call_step(std::span<Gradient> gradients, bool local_only) {
    session_type::check_gradients(gradients, parameters_);
    if constexpr (incremental) {
      auto step = open_step(local_only);
      // Backward produces the last tensors' gradients first: hand them over in that order.
      for (std::size_t i = gradients.size(); i-- > 0;) step.ready(i, gradients[i]);
      step.finish();
    } else {
      replica_.step(agent_, comm_, gradients, local_only, optimizer_, meter_);
    }
  }

  pending_step open_step(bool local_only) {
    static_assert(incremental,
                  "strategy::begin_step: the incremental step takes host tensors for now; with CUDA tensors call "
                  "step(grads)");
    session_.refuse_overlap(rank());
    if (is_server())
      throw error(errc::invalid_argument, "strategy::begin_step: rank " + std::to_string(rank()) +
                                              " is a server: call serve() on it instead of stepping (it is one of the parameter servers)");
    session_.refuse_out_of_step();
    // First, so that what a given-up step left in flight is done before anything here
    // reads the transport (its counters) or the agent's buffers.
    if (!local_only) agent_.begin_step(comm_);
    session_.open(local_only);
    meter_.open(comm_, local_only);
    return pending_step(this);
  }

  // step.ready / step.unused: gradient i is final for this step.
  void mark_ready(std::size_t i, std::span<const value_type> grad, mark how) {
    session_.check_index(i, how);
    if (how == mark::ready)
      session_type::check_size("strategy: step.ready: gradient ", i, grad.size(), parameters_[i].size());
    if (how == mark::ready && check_finite_) training::check_finite(comm_, i, parameters_[i].shape(), grad);
    std::lock_guard lock(session_.mutex());
    session_.mark_tensor(i, how, parameters_[i].shape());
    if (how == mark::unused) grad = accumulation_.zeros(i);
    if (session_.local_only()) {
      accumulation_.add(i, grad);
      return;
    }
    if (accumulation_.micro_batches() > 0) grad = accumulation_.fold(i, grad);
    agent_.ready(comm_, i, grad);
  }

  // step.finish(): every tensor marked? then the aggregation completes the step.
  void finish_open_step() {
    struct closer {
      strategy* s;
      ~closer() { s->close_step(); }
    } close_on_exit{this};
    if (auto refused = session_.finish(parameters_, rank(), size())) {
      accumulation_.discard();
      throw error(errc::invalid_argument, *refused);
    }
    const auto began = comm_.time().now();
    if (session_.local_only()) {
      accumulation_.micro_batch_done();
    } else {
      accumulation_.folded();  // into this step's gradients by ready()
      try {
        agent_.finish_step(comm_, replica_.parameters(),
                           [this](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
                             meter_.timed_optimizer(comm_, i, grad.size_bytes(),
                                                    [&] { replica_.apply(optimizer_, i, grad, grad_scale); });
                           });
      } catch (...) {
        session_.fall_out_of_step("a step failed in finish() (some of its update may be applied here only)", rank(),
                                  size());
        throw;
      }
      // An aggregation that keeps replicas' optimizer state in step too (local SGD's
      // average_optimizer_state) gets it after the update (host tensors only so far).
      if constexpr (concepts::state_synchronising_agent<agent_type, value_type, Transport, optimizer_state_type>)
        agent_.template synchronise_state<value_type>(comm_, replica_.states());
    }
    meter_.finish(comm_, agent_, began);
  }

  // A step ends: finished, failed, or its handle dropped before finish() (which gives up
  // the gradients accumulated for it too).
  void close_step() noexcept {
    session_.close();
    meter_.close();
  }
  void abandon_step() noexcept {
    accumulation_.discard();
    session_.give_up("a step was dropped after some of its gradients were handed over", rank(), size());
    close_step();
  }

  communicator_type comm_;
  Optimizer optimizer_;
  agent_type agent_;
  std::vector<Tensor> parameters_;
  replica_type replica_;                             // the parameters' host view, the optimizer states
  session_type session_;                             // the incremental step in progress
  training::accumulation<value_type> accumulation_;  // no_sync micro-batches; an unused tensor's zeros
  training::step_meter<Transport> meter_;            // time, traffic, timeline and logs of each step
  bool check_finite_ = false;                        // check_finite_gradients
};

}  // namespace gradwire
