// Where strategy<> keeps a replica's tensors and optimizer state (concepts::replica): host_replica, the device replica's primary template, and the choice by the tensor's location.
//
// Every aggregation works on a host view of the parameters (a span per tensor). A host
// replica's view is the tensors themselves, and the optimizer runs on it a tensor at a
// time as the aggregation applies each update (concepts::incremental_replica), so the
// strategy's incremental step works on it. For CUDA tensors, cuda/device_replica.cuh
// specialises device_replica: pinned host mirrors, the optimizer on the device, the
// one-call step only.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../support/always_false.hpp"
#include "../tensor/element_range.hpp"

namespace gradwire::training {

// Template parameters:
//   Tensor     concepts::host_tensor_type   the parameters, updated where they are
//   Optimizer  concepts::optimizer          its state<V>, one per tensor, is kept here (for the
//              slice of the tensor a concepts::sharding_agent gives this replica: ZeRO-1)
// A concepts::incremental_replica: strategy<> asserts it for the replica it keeps (a check
// here, on some tensor and optimizer, would cost every translation unit that includes
// strategy.hpp the instantiation).
template <class Tensor, class Optimizer>
class host_replica {
 public:
  using value_type = typename Tensor::value_type;
  using state_type = typename Optimizer::template state<value_type>;
  static constexpr const char* where = "";

  template <class Agent, class Transport>
  void setup(Agent& agent, collective::communicator<Transport>& comm, std::span<Tensor> tensors,
             Optimizer& optimizer) {
    view_.reserve(tensors.size());
    for (auto& p : tensors) view_.emplace_back(p.data(), p.size());
    agent.setup(comm, parameters());
    // An agent that steps one slice of each tensor here (ZeRO-1) says which, once set up:
    // the state is made for that slice alone.
    if constexpr (concepts::sharding_agent<Agent>)
      for (std::size_t i = 0; i < view_.size(); ++i) owned_.push_back(agent.owned(i));
    states_.reserve(tensors.size());
    for (std::size_t i = 0; i < view_.size(); ++i)
      states_.push_back(optimizer.template init<value_type>(owned_.empty() ? view_[i].size() : owned_[i].count));
    // An aggregation that keeps the replicas' optimizer state in step gets it once after
    // setup too: a replica that joined a running job takes its state there (elastic_all_reduce).
    if constexpr (concepts::state_synchronising_agent<Agent, value_type, Transport, state_type>)
      agent.template synchronise_state<value_type>(comm, states());
  }
  std::span<const std::span<value_type>> parameters() const noexcept { return view_; }
  std::span<state_type> states() noexcept { return states_; }
  std::span<const state_type> states() const noexcept { return states_; }
  template <class F>
  auto on_host(F&& f) {
    return std::forward<F>(f)();
  }
  void apply(Optimizer& optimizer, std::size_t i, std::span<const value_type> grad, value_type grad_scale) {
    if (owned_.empty())
      optimizer.step(states_[i], view_[i], grad, grad_scale);
    else
      optimizer.step(states_[i], view_[i].subspan(owned_[i].offset, owned_[i].count), grad, grad_scale);
  }

 private:
  std::vector<state_type> states_;
  std::vector<std::span<value_type>> view_;
  std::vector<element_range> owned_;  // [tensor]: what this replica steps, under a sharding agent (else empty)
};

// How a strategy keeps a replica whose tensors live on a device (see
// gradwire/cuda/device_replica.cuh, which specialises it for CUDA tensors).
template <class Tensor, class Optimizer, class = void>
class device_replica {
  static_assert(support::always_false_v<Tensor>,
                "gradwire::strategy: Tensor lives on a CUDA device: include <gradwire/cuda.cuh> and compile this "
                "translation unit with nvcc");
};

// The replica strategy<Tensor, Optimizer, ...> keeps.
template <class Tensor, class Optimizer>
using replica_t = std::conditional_t<Tensor::location == memory_location::cuda, device_replica<Tensor, Optimizer>,
                                     host_replica<Tensor, Optimizer>>;

}  // namespace gradwire::training
