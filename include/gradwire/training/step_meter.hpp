// step_meter<Transport>: what a strategy's steps cost (time, traffic, optimizer), on the timeline, in the stats and the logs.
//
// A step's stats split the time since the last step ended into the caller's compute (up to
// the step's start: for the incremental step, up to finish()) and the time in the step,
// and count the optimizer's share and the bytes the transport moved meanwhile (where it is
// a concepts::metered_transport). Steps are numbered from 1 everywhere: the timeline, the
// stall reports (observe::current_step) and the logs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "../clock.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../observe/activity.hpp"
#include "../observe/log.hpp"
#include "../observe/step_stats.hpp"
#include "../observe/timeline.hpp"
#include "../observe/type_name.hpp"
#include "../support/traffic.hpp"

namespace gradwire::training {

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

// Template parameter:
//   Transport  concepts::transport  its traffic() counts the step's bytes where it has one
template <class Transport>
class step_meter {
 public:
  // Times are on the rank's time (communicator::time()): virtual on a simulated rank.
  using time_point = deadline;
  using duration = clock::duration;
  using communicator_type = collective::communicator<Transport>;

  // Setup began at `began` and is over: the first step's compute counts from now. Returns
  // how long setup took.
  duration setup_finished(const communicator_type& comm, time_point began) {
    last_step_end_ = comm.time().now();
    return last_step_end_ - began;
  }

  // Whether a step's bytes are read from the transport: not while the agent communicates
  // on the communicator's thread between steps (concepts::background_communicating_agent).
  void measure_traffic(bool on) noexcept { measure_traffic_ = on; }

  // A step (or a micro-batch) starts: the traffic so far, its timeline scope, the step
  // number for stall reports, the optimizer's time from zero.
  observe::trace_scope start(const communicator_type& comm, const char* name) {
    traffic_before_ = traffic(comm);
    observe::trace_scope scope = comm.trace(name, 0, "strategy");
    scope.arg("step", static_cast<std::int64_t>(cumulative_.steps + 1));
    observe::current_step().store(cumulative_.steps + 1, std::memory_order_relaxed);  // for stall reports
    optimizer_time_ = {};
    return scope;
  }
  // The incremental step opens (a simulated rank's compute ends here); its scope stays
  // open until close().
  void open(const communicator_type& comm, bool micro_batch) {
    comm.time().step_began();
    trace_.open(start(comm, micro_batch ? "micro_batch" : "step"));
  }
  void close() noexcept { trace_.reset(); }

  // Runs the optimizer on tensor i: timed for the step's stats, traced on the timeline.
  template <class F>
  void timed_optimizer(const communicator_type& comm, std::size_t i, std::size_t bytes, F&& run) {
    auto trace = comm.trace("optimizer_step", bytes, "optimizer");
    trace.arg("tensor", static_cast<std::int64_t>(i));
    const time_source time = comm.time();
    const auto began = time.now();
    run();
    optimizer_time_ += time.now() - began;
  }

  // The step's work began at `began` and is done: its stats, added to the totals.
  template <class Agent>
  void finish(const communicator_type& comm, const Agent& agent, time_point began) {
    const auto ended = comm.time().now();
    last_step_ = {};
    last_step_.steps = 1;
    last_step_.traffic = traffic(comm) - traffic_before_;
    last_step_.traffic_measured = concepts::metered_transport<Transport> && measure_traffic_;
    last_step_.in_step = ended - began;
    last_step_.optimizer = optimizer_time_;
    last_step_.compute = began - last_step_end_;
    if constexpr (concepts::staleness_reporting_agent<Agent>) last_step_.staleness = agent.last_staleness();
    if constexpr (concepts::dropping_agent<Agent>) last_step_.dropped = agent.last_step_dropped() ? 1 : 0;
    cumulative_ += last_step_;
    last_step_end_ = ended;
    if (observe::log_enabled(observe::log_level::debug))
      observe::log(comm.time(), observe::log_level::debug, comm.rank(), comm.size(), "step ", cumulative_.steps, ": ", observe::to_string(last_step_));
    trace_.bytes(last_step_.traffic.bytes_sent);
  }

  const observe::step_stats& last() const noexcept { return last_step_; }
  const observe::step_stats& cumulative() const noexcept { return cumulative_; }

  // The info line of a strategy that is ready (`where`: the replica's, "" on the host).
  template <class Aggregation, class Tensors>
  static void log_setup(const communicator_type& comm, duration took, const Tensors& parameters,
                        const char* where, bool serves) {
    std::size_t elements = 0;
    for (const auto& p : parameters) elements += p.size();
    observe::log(comm.time(), observe::log_level::info, comm.rank(), comm.size(), "strategy ready in ",
                      std::chrono::duration<double, std::milli>(took).count(), " ms: ",
                      observe::type_name<Aggregation>(), ", ", std::size(parameters), " tensor(s), ", elements,
                      " elements (", elements * sizeof(typename Tensors::value_type::value_type), " bytes)", where,
                      serves ? "; this rank serves" : "");
  }

 private:
  support::traffic_counters traffic(const communicator_type& comm) const {
    if constexpr (concepts::metered_transport<Transport>)
      if (measure_traffic_) return comm.transport().traffic();
    return {};
  }

  observe::step_stats last_step_, cumulative_;
  time_point last_step_end_;
  duration optimizer_time_{};
  support::traffic_counters traffic_before_;
  bool measure_traffic_ = true;
  step_trace trace_;
};

}  // namespace gradwire::training
