// Which agent strategy<> builds for an aggregation, and the agent that adapts a whole-step aggregation.
//
// An incremental aggregation names its agent (`A::agent<V, Tr>`); a whole-step one (setup
// + step on the policy itself, a user's own in one piece) is wrapped in whole_step_agent,
// which remembers each ready gradient and hands them all to step() at finish. Such an
// aggregation starts communicating only once backward is over, but works with every
// entry point of the strategy (begin_step/ready/finish, accumulation, step(grads)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"

namespace gradwire::aggregation {

template <class A, class V, class Tr>
class whole_step_agent {
 public:
  using policy_type = A;

  explicit whole_step_agent(A aggregation) : aggregation_(std::move(aggregation)) {}

  static constexpr bool updates_only_through_apply = concepts::updates_only_through_apply<A>;

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    grads_.assign(params.size(), {});
    aggregation_.setup(comm, params);
  }
  void begin_step(collective::communicator<Tr>&) {}
  void ready(collective::communicator<Tr>&, std::size_t i, std::span<const V> grad) { grads_[i] = grad; }
  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, Apply&& apply) {
    aggregation_.step(comm, params, std::span<const std::span<const V>>(grads_), apply);
  }

  // The hooks the wrapped aggregation has, forwarded.
  void finish(collective::communicator<Tr>& comm)
    requires concepts::finishing_agent<A, Tr>
  {
    aggregation_.finish(comm);
  }
  bool is_server(int rank, int size) const
    requires concepts::server_choosing_agent<A>
  {
    return aggregation_.is_server(rank, size);
  }
  template <class Optimizer>
    requires concepts::serving_agent<A, V, Tr, Optimizer>
  auto serve(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, const Optimizer& optimizer) {
    return aggregation_.serve(comm, params, optimizer);
  }
  template <class W, class State>
    requires concepts::state_synchronising_agent<A, V, Tr, State>
  void synchronise_state(collective::communicator<Tr>& comm, std::span<State> states) {
    aggregation_.template synchronise_state<V>(comm, states);
  }
  bool averages_optimizer_state() const
    requires concepts::state_averaging_agent<A>
  {
    return aggregation_.averages_optimizer_state();
  }
  std::uint64_t last_staleness() const
    requires concepts::staleness_reporting_agent<A>
  {
    return aggregation_.last_staleness();
  }

  // The user's aggregation object (strategy<>::aggregation() returns it).
  A& aggregation() noexcept { return aggregation_; }
  const A& aggregation() const noexcept { return aggregation_; }

 private:
  A aggregation_;
  std::vector<std::span<const V>> grads_;  // this step's, as ready() gave them
};

namespace detail {
template <class A, class V, class Tr>
struct agent_of {
  using type = whole_step_agent<A, V, Tr>;
};
template <class A, class V, class Tr>
  requires concepts::incremental_aggregation<A, V, Tr>
struct agent_of<A, V, Tr> {
  using type = typename A::template agent<V, Tr>;
};
}  // namespace detail

// The agent strategy<> builds for aggregation A over value type V and transport Tr.
template <class A, class V, class Tr>
using agent_t = typename detail::agent_of<A, V, Tr>::type;

template <class A, class V, class Tr>
inline constexpr bool is_whole_step_v = !concepts::incremental_aggregation<A, V, Tr>;

}  // namespace gradwire::aggregation
