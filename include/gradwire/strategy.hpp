// strategy<Tensor, Optimizer, Aggregation, Transport>: one replica's view of data-parallel training.
//
// The template alone: it includes no aggregation and no transport (a translation unit
// names the ones it uses). The named combinations (mirrored, one_device, ...) are in
// gradwire/strategies/, one header each, and all of them in gradwire/strategies.hpp.
// Its parts are in training/: the check of its policies, the replica that holds the tensors
// and the optimizer state (host, or a CUDA device), and the step driver (the step session,
// gradient accumulation, the step meter and the finite check).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
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
#include "training/policy_check.hpp"
#include "training/replica.hpp"
#include "training/step_driver.hpp"
#include "training/step_session.hpp"

namespace gradwire {

// Template parameters (each checked against its concept in concepts.hpp):
//   Tensor       concepts::tensor       where this replica's parameters and gradients live
//   Optimizer    concepts::optimizer  how an update is computed from a gradient
//   Aggregation  concepts::aggregation  how replicas agree on the update
//   Transport    concepts::transport  how bytes move between replicas
template <class Tensor, class Optimizer, class Aggregation, class Transport>
class strategy {
  // Each policy against its concept, with a message that names what is missing (training/policy_check.hpp).
  static_assert(training::policies_fit<Tensor, Optimizer, Aggregation, Transport>::value);

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
        driver_(parameters_) {
    const auto setup_began = comm_.time().now();
    // Before anything else that communicates: ranks with different models fail here, all
    // of them, naming both models, not later in some collective (or never: a hang).
    // (A replacement of a lost worker joins a running job: the others checked long ago.)
    std::vector<shape> shapes;
    shapes.reserve(parameters_.size());
    for (const auto& p : parameters_) shapes.push_back(p.shape());
    if (!concepts::rejoined(comm_.transport())) collective::check_same_model(comm_, dtype_of_v<value_type>, shapes);
    if constexpr (concepts::shape_aware_agent<agent_type>) agent_.use_shapes(shapes);
    check_finite_gradients(driver_.checks_finite());  // GRADWIRE_CHECK_FINITE=1: refused where the replica cannot check
    replica_.setup(agent_, comm_, std::span<Tensor>(parameters_), optimizer_);
    const auto took = driver_.meter().setup_finished(comm_, setup_began);
    if (observe::log_enabled(observe::log_level::info))
      driver_.meter().template log_setup<Aggregation>(comm_, took, parameters_, replica_type::where, is_server());
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
  // A learning-rate schedule: before the update of step s (counted from 0 at
  // construction), lr = schedule(s). Unlike set_lr before each step, it gives every update
  // its own step's rate, also the several a K-of-N replica applies in one finish when it
  // was late (docs/elastic.md). Needs Optimizer::set_lr (concepts::schedulable_optimizer).
  template <class Schedule>
  void schedule_lr(Schedule schedule) {
    static_assert(concepts::schedulable_optimizer<Optimizer>,
                  "gradwire::strategy::schedule_lr: Optimizer has no set_lr(double), so a schedule cannot set its rate "
                  "(concepts::schedulable_optimizer)");
    static_assert(concepts::host_tensor_type<Tensor>,
                  "gradwire::strategy::schedule_lr: host tensors for now (a CUDA replica's one-call step sets no "
                  "schedule yet); call optimizer().set_lr before each step");
    static_assert(std::is_invocable_r_v<double, Schedule&, std::uint64_t>,
                  "gradwire::strategy::schedule_lr: the schedule must take the step (std::uint64_t) and return the "
                  "learning rate (double)");
    driver_.schedule_lr(std::move(schedule));
  }

  void check_finite_gradients(bool on) {
    if (on && !incremental)
      throw error(errc::invalid_argument,
                  "gradwire::strategy: the non-finite gradient check (check_finite_gradients, GRADWIRE_CHECK_FINITE) is "
                  "not available for CUDA tensors yet; leave it off");
    driver_.checks_finite(on);
  }
  bool checks_finite_gradients() const noexcept { return driver_.checks_finite(); }

  // Micro-batches accumulated since the last synchronised step.
  std::size_t accumulated_micro_batches() const noexcept { return driver_.accumulated_micro_batches(); }

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

  // Applies now the updates the aggregation still owes (streaming DiLoCo with a delay:
  // fragments whose all-reduce has run and whose outer update would land after a later
  // step), after waiting for its background communication. Call it on every rank after the
  // last step, before reading, evaluating or saving the final parameters; between steps,
  // every rank after the same one. Aggregations that owe nothing make it a no-op.
  void flush() {
    if constexpr (concepts::flushing_agent<agent_type, value_type, Transport>)
      replica_.on_host([&] { agent_.flush(comm_, replica_.parameters()); });
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
  // Bytes of optimizer state this replica holds (velocity, moments; their buffers): with
  // aggregation::sharded (ZeRO-1) about 1/N of what all_reduce keeps on every replica.
  std::size_t optimizer_state_bytes() const
    requires concepts::buffer_visiting_state<const optimizer_state_type>
  {
    std::size_t bytes = 0;
    for (const auto& s : replica_.states()) s.for_each_buffer([&](auto b) { bytes += b.size_bytes(); });
    return bytes;
  }
  communicator_type& communicator() noexcept { return comm_; }
  // The time this rank runs on (clock.hpp): virtual on a simulated rank. Time a training
  // loop with it (time().now()) so that its figures agree with the step stats.
  time_source time() const { return comm_.time(); }

  // What the latest step cost this rank (bytes, communication vs optimizer vs the
  // caller's compute, staleness), and the same added up over every step so far. With the
  // incremental API, time in the step is what finish() took: communication hidden behind
  // backward (before finish) counts as compute.
  const observe::step_stats& last_step_stats() const noexcept { return driver_.meter().last(); }
  const observe::step_stats& cumulative_stats() const noexcept { return driver_.meter().cumulative(); }

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
  using driver_type = training::step_driver<Tensor, Optimizer, agent_type, replica_type, Transport>;
  // Host tensors: the incremental step, accumulation and the finite check; CUDA tensors:
  // the replica's own one-call step.
  static constexpr bool incremental = concepts::incremental_replica<replica_type, Tensor, Optimizer, Transport>;
  static_assert(concepts::replica<replica_type, Tensor, Optimizer, Transport>,
                "gradwire::strategy: the replica chosen for Tensor does not satisfy gradwire::concepts::replica (see "
                "gradwire/concepts.hpp)");

  template <class Gradient>
  void one_call_step(std::span<Gradient> gradients, bool local_only) {
    training::step_session<Tensor>::check_gradients(gradients, parameters_);
    if constexpr (incremental) {
      auto step = open_step(local_only);
      // Backward produces the last tensors' gradients first: hand them over in that order.
      for (std::size_t i = gradients.size(); i-- > 0;) step.ready(i, gradients[i]);
      step.finish();
    } else {
      replica_.step(agent_, comm_, gradients, local_only, optimizer_, driver_.meter());
    }
  }

  pending_step open_step(bool local_only) {
    static_assert(incremental,
                  "strategy::begin_step: the incremental step takes host tensors for now; with CUDA tensors call "
                  "step(grads)");
    driver_.open(parts(), local_only, is_server());
    return pending_step(this);
  }

  // What pending_step calls (step.ready / step.unused, step.finish(), a handle dropped):
  // the driver, with this strategy's parts (taken afresh: the strategy may have moved).
  typename driver_type::parts parts() noexcept { return {comm_, agent_, replica_, optimizer_, parameters_}; }
  void mark_ready(std::size_t i, std::span<const value_type> grad, training::mark how) {
    driver_.mark_ready(parts(), i, grad, how);
  }
  void finish_open_step() { driver_.finish(parts()); }
  void abandon_step() noexcept { driver_.abandon(parts()); }

  communicator_type comm_;
  Optimizer optimizer_;
  agent_type agent_;
  std::vector<Tensor> parameters_;
  replica_type replica_;  // the parameters' host view, the optimizer states
  driver_type driver_;    // the step in progress, no_sync sums, the meter, the finite check's switch
};

}  // namespace gradwire
