// step_driver: strategy<>'s incremental step, driven through the strategy's parts: open, each gradient ready, finish (the update) or give up.
//
// The strategy owns what a step works on (the communicator, the agent, the replica, the
// optimizer, the parameters) and hands it to every call as step_parts, references taken
// afresh each time: a strategy moves, so nothing here points into it. The driver owns what
// only steps use: the session (step_session.hpp), the no_sync sums (accumulation.hpp),
// the meter (step_meter.hpp, which a device replica's one-call step uses too) and the
// finite check's switch (finite_check.hpp). pending_step calls the strategy, which
// forwards here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "accumulation.hpp"
#include "finite_check.hpp"
#include "step_meter.hpp"
#include "step_session.hpp"

namespace gradwire::training {

// What a step works on, all of it the strategy's.
template <class Tensor, class Optimizer, class Agent, class Replica, class Transport>
struct step_parts {
  collective::communicator<Transport>& comm;
  Agent& agent;
  Replica& replica;
  Optimizer& optimizer;
  std::span<Tensor> parameters;
};

// Template parameters: the strategy's Tensor, Optimizer and Transport, and
//   Agent    concepts::aggregation_agent    the strategy's agent_type
//   Replica  concepts::incremental_replica  the strategy's replica_type (a device replica,
//            which has no incremental step, uses only meter())
template <class Tensor, class Optimizer, class Agent, class Replica, class Transport>
class step_driver {
 public:
  using value_type = typename Tensor::value_type;
  using parts = step_parts<Tensor, Optimizer, Agent, Replica, Transport>;

  // GRADWIRE_CHECK_FINITE is read here, before the strategy communicates.
  explicit step_driver(const std::vector<Tensor>& parameters)
      : session_(parameters.size()), accumulation_(parameters), check_finite_(finite_check_from_env()) {}

  // strategy::schedule_lr: before the update of step s (from 0 at setup), lr = schedule(s).
  void schedule_lr(std::function<double(std::uint64_t)> schedule) {
    lr_schedule_ = std::move(schedule);
    lr_step_.reset();
  }

  step_meter<Transport>& meter() noexcept { return meter_; }
  const step_meter<Transport>& meter() const noexcept { return meter_; }
  std::size_t accumulated_micro_batches() const noexcept { return accumulation_.micro_batches(); }
  bool checks_finite() const noexcept { return check_finite_; }
  void checks_finite(bool on) noexcept { check_finite_ = on; }

  // begin_step(): refused while a step is open, on a server rank (`serves`), and on a rank
  // out of step; else the step opens.
  void open(parts p, bool local_only, bool serves) {
    session_.refuse_overlap(p.comm.rank());
    if (serves)
      throw error(errc::invalid_argument, "strategy::begin_step: rank " + std::to_string(p.comm.rank()) +
                                              " is a server: call serve() on it instead of stepping (it is one of the parameter servers)");
    session_.refuse_out_of_step();
    // First, so that what a given-up step left in flight is done before anything here
    // reads the transport (its counters) or the agent's buffers.
    if (!local_only) p.agent.begin_step(p.comm);
    session_.open(local_only);
    if constexpr (concepts::background_communicating_agent<Agent>)
      meter_.measure_traffic(!p.agent.communicates_between_steps());
    meter_.open(p.comm, local_only);
  }

  // step.ready / step.unused: gradient i is final for this step.
  void mark_ready(parts p, std::size_t i, std::span<const value_type> grad, mark how) {
    session_.check_index(i, how);
    if (how == mark::ready)
      step_session<Tensor>::check_size("strategy: step.ready: gradient ", i, grad.size(), p.parameters[i].size());
    if (how == mark::ready && check_finite_) check_finite(p.comm, i, p.parameters[i].shape(), grad);
    std::lock_guard lock(session_.mutex());
    session_.mark_tensor(i, how, p.parameters[i].shape());
    if (how == mark::unused) grad = accumulation_.zeros(i);
    if (session_.local_only()) {
      accumulation_.add(i, grad);
      return;
    }
    if (accumulation_.micro_batches() > 0) grad = accumulation_.fold(i, grad);
    p.agent.ready(p.comm, i, grad);
  }

  // step.finish(): every tensor marked? then the aggregation completes the step.
  void finish(parts p) {
    struct closer {
      step_driver* d;
      ~closer() { d->close(); }
    } close_on_exit{this};
    if (auto refused = session_.finish(p.parameters, p.comm.rank(), p.comm.size())) {
      accumulation_.discard();
      throw error(errc::invalid_argument, *refused);
    }
    const auto began = p.comm.time().now();
    if (session_.local_only()) {
      accumulation_.micro_batch_done();
    } else {
      accumulation_.folded();  // into this step's gradients by ready()
      try {
        p.agent.finish_step(p.comm, p.replica.parameters(),
                            [this, &p](std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
                              follow_schedule(p);
                              meter_.timed_optimizer(p.comm, i, grad.size_bytes(),
                                                     [&] { p.replica.apply(p.optimizer, i, grad, grad_scale); });
                            });
        if constexpr (!concepts::step_counting_agent<Agent>) ++steps_applied_;
      } catch (...) {
        session_.fall_out_of_step("a step failed in finish() (some of its update may be applied here only)",
                                  p.comm.rank(), p.comm.size());
        throw;
      }
      // An aggregation that keeps replicas' optimizer state in step too (local SGD's
      // average_optimizer_state) gets it after the update (host tensors only so far).
      if constexpr (concepts::state_synchronising_agent<Agent, value_type, Transport, typename Replica::state_type>)
        p.agent.template synchronise_state<value_type>(p.comm, p.replica.states());
    }
    meter_.finish(p.comm, p.agent, began);
  }

  // A step ends: finished, failed, or its handle dropped before finish() (which gives up
  // the gradients accumulated for it too).
  void close() noexcept {
    session_.close();
    meter_.close();
  }
  void abandon(parts p) noexcept {
    accumulation_.discard();
    session_.give_up("a step was dropped after some of its gradients were handed over", p.comm.rank(),
                     p.comm.size());
    close();
  }

 private:
  // The schedule's rate for the step being applied, set once per step.
  void follow_schedule(parts& p) {
    if constexpr (concepts::schedulable_optimizer<Optimizer>) {
      if (!lr_schedule_) return;
      std::uint64_t step = steps_applied_;
      if constexpr (concepts::step_counting_agent<Agent>) step = p.agent.applying_step();
      if (lr_step_ == step) return;
      p.optimizer.set_lr(lr_schedule_(step));
      lr_step_ = step;
    }
  }

  step_session<Tensor> session_;          // the incremental step in progress
  accumulation<value_type> accumulation_;  // no_sync micro-batches; an unused tensor's zeros
  step_meter<Transport> meter_;            // time, traffic, timeline and logs of each step
  bool check_finite_ = false;              // strategy::check_finite_gradients
  std::function<double(std::uint64_t)> lr_schedule_;  // strategy::schedule_lr
  std::optional<std::uint64_t> lr_step_;               // the step whose rate is set
  std::uint64_t steps_applied_ = 0;                    // an agent that does not count them
};

}  // namespace gradwire::training
