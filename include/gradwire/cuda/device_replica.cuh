// How strategy<> trains CUDA tensors with every aggregation and transport unchanged (concepts::replica): pinned host
// mirrors for the aggregation, the optimizer on the device.
//
// Aggregations and transports work on host spans. For a replica whose tensors live on a
// GPU the strategy hands them pinned host mirrors: gradients are copied down once per step
// (or not at all when the aggregation only passes them to apply on one rank), and every
// apply(i, grad, scale) copies the combined gradient up and runs the optimizer's fused
// device step on the parameters, with optimizer state in device memory. Aggregations
// that write parameters themselves (averaging, central storage, parameter servers) get
// an up-to-date host mirror, and the mirror goes back to the device after their step.
// Aggregations that declare `updates_only_through_apply` skip both parameter copies, and
// an aggregation with a device path (a device_step found by ADL, as all-reduce has in
// aggregation/cuda_all_reduce.cuh) never leaves device memory at all. It takes the one-call
// step only (not concepts::incremental_replica): step(grads), no begin_step, no no_sync.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../aggregation/cuda_all_reduce.cuh"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../optim/cuda.cuh"
#include "../optim/sgd.hpp"              // for the self-check below
#include "../tensor/cuda_tensor.cuh"     // likewise
#include "../tensor/element_range.hpp"
#include "../training/replica.hpp"
#include "../training/step_meter.hpp"
#include "runtime.cuh"

namespace gradwire::training {

template <class Tensor, class Optimizer>
class device_replica<Tensor, Optimizer, std::enable_if_t<Tensor::location == memory_location::cuda>> {
  using V = typename Tensor::value_type;
  static_assert(concepts::device_optimizer<Optimizer, V>,
                "gradwire::strategy: Tensor lives on a CUDA device but Optimizer has no device path: it needs "
                "optim::device_state<Optimizer, V>, init_device and step_device (see gradwire/optim/cuda.cuh)");

 public:
  using state_type = optim::device_state<Optimizer, V>;
  static constexpr const char* where = ", on the CUDA device";

  device_replica() = default;
  device_replica(device_replica&&) = default;
  device_replica& operator=(device_replica&&) = default;
  // After an exception mid-step, work may still be queued on the tensors' streams that
  // reads the scratch freed below: wait for it first.
  ~device_replica() {
    for (auto& p : parameters_) (void)cudaStreamSynchronize(p.stream());
  }

  // The aggregation sees pinned host mirrors; its setup may overwrite them (a broadcast).
  template <class Agent, class Tr>
  void setup(Agent& agent, collective::communicator<Tr>& comm, std::span<Tensor> tensors, const Optimizer& optimizer) {
    if constexpr (concepts::state_averaging_agent<Agent>)
      if (agent.averages_optimizer_state())
        throw error(errc::invalid_argument,
                    "gradwire::strategy: this aggregation keeps the replicas' optimizer state in step (local SGD's "
                    "average_optimizer_state(), elastic_all_reduce's joins), which CUDA tensors do not support yet "
                    "(the optimizer state lives on the device); turn it off");
    allocate(tensors);
    view_.reserve(tensors.size());
    grad_spans_.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) view_.push_back(host_parameters(i));
    on_host([&] { agent.setup(comm, parameters()); });
    // An agent that steps one slice of each tensor here (ZeRO-1) says which, once set up:
    // the device state is made for that slice alone.
    if constexpr (concepts::sharding_agent<Agent>)
      for (std::size_t i = 0; i < tensors.size(); ++i) owned_.push_back(agent.owned(i));
    init_states(optimizer);
  }

  std::span<const std::span<V>> parameters() const noexcept { return view_; }
  std::span<state_type> states() noexcept { return states_; }
  std::span<const state_type> states() const noexcept { return states_; }

  // f() on the host mirror, fresh from the device; the device then gets what f wrote (a
  // parameter server keeps its shard and its optimizer state on the host; the tensors get
  // the final values back).
  template <class F>
  auto on_host(F&& f) {
    download_parameters();
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      upload_parameters();
    } else {
      auto result = f();
      upload_parameters();
      return result;
    }
  }

  // The one-call step, timed and traced by `meter` as a host step is.
  template <class Agent, class Tr, class Gradient>
  void step(Agent& agent, collective::communicator<Tr>& comm, std::span<Gradient> gradients, bool local_only,
            const Optimizer& optimizer, step_meter<Tr>& meter) {
    static_assert(concepts::tensor<std::remove_const_t<Gradient>>,
                  "strategy::step: the parameters are CUDA tensors, so the gradients must be CUDA tensors too "
                  "(cuda_tensor or cuda_tensor_view)");
    if (local_only)
      throw error(errc::invalid_argument, "strategy::step(grads, no_sync): gradient accumulation is not "
                                          "available for CUDA tensors yet; accumulate on the device and step once");
    const auto began = comm.time().now();
    auto trace = meter.start(comm, "step");
    staged_step(agent, comm, gradients, optimizer, meter);
    meter.finish(comm, agent, began);
    trace.bytes(meter.last().traffic.bytes_sent);
  }

 private:
  // Gradients staged to the host only when the aggregation will read them, the optimizer
  // on the device.
  template <class Agent, class Tr, class Gradient>
  void staged_step(Agent& agent, collective::communicator<Tr>& comm, std::span<Gradient> gradients,
                   const Optimizer& optimizer, step_meter<Tr>& meter) {
    if (step_in_device_memory(agent, comm, gradients, optimizer)) return;
    constexpr bool apply_only = concepts::updates_only_through_apply<Agent>;
    stage_gradients(gradients, apply_only && comm.size() == 1, grad_spans_);
    agent.begin_step(comm);
    for (std::size_t i = grad_spans_.size(); i-- > 0;) agent.ready(comm, i, grad_spans_[i]);
    agent.finish_step(comm, parameters(), [&](std::size_t i, std::span<const V> grad, V grad_scale) {
      meter.timed_optimizer(comm, i, grad.size_bytes(), [&] { apply(optimizer, i, grad, grad_scale, !apply_only); });
    });
    finish_step(!apply_only);
  }

  void allocate(std::span<Tensor> parameters) {
    parameters_ = parameters;
    offsets_.clear();
    std::size_t total = 0;
    for (auto& p : parameters) {
      offsets_.push_back(total);
      total += p.size();
    }
    host_parameters_.reserve_discard(total);
    host_gradients_.reserve_discard(total);
    device_gradients_.reserve_discard(total);
    incoming_.assign(parameters.size(), nullptr);
  }
  // Each tensor's state: for the whole tensor, or for the slice a sharding agent gave it.
  void init_states(const Optimizer& optimizer) {
    states_.resize(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      init_device(optimizer, states_[i], stepped(i).count, parameters_[i].stream());
    // The scratch came from the legacy stream; the tensors' own streams use it from here on.
    cuda::check(cudaDeviceSynchronize(), "strategy: setting up device state");
  }
  // The elements of tensor i this replica's optimizer steps: all, or its shard.
  element_range stepped(std::size_t i) const noexcept {
    return owned_.empty() ? element_range{0, parameters_[i].size()} : owned_[i];
  }

  std::span<V> host_parameters(std::size_t i) noexcept {
    return {host_parameters_.data() + offsets_[i], parameters_[i].size()};
  }
  // The host mirror := the device parameters, and back.
  void download_parameters() {
    for (std::size_t i = 0; i < parameters_.size(); ++i) copy(host_parameters(i).data(), parameters_[i].data(), i, cudaMemcpyDeviceToHost);
    synchronize();
  }
  void upload_parameters() {
    for (std::size_t i = 0; i < parameters_.size(); ++i) copy(parameters_[i].data(), host_parameters(i).data(), i, cudaMemcpyHostToDevice);
    synchronize();
  }

  // This step's gradients as the aggregation will see them: the device tensors themselves
  // when `pass_through` (the aggregation gives them straight to apply), else host copies.
  template <class Gradient>
  void stage_gradients(std::span<Gradient> gradients, bool pass_through, std::vector<std::span<const V>>& out) {
    static_assert(std::remove_const_t<Gradient>::location == memory_location::cuda,
                  "strategy::step: the parameters are CUDA tensors, so the gradients must be too (cuda_tensor or "
                  "cuda_tensor_view)");
    out.clear();
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      const V* device = gradients[i].data();
      incoming_[i] = device;
      if (pass_through) {
        out.emplace_back(device, gradients[i].size());
      } else {
        V* host = host_gradients_.data() + offsets_[i];
        // Ordered on the parameter's stream after the work that produced the gradient
        // there; gradients made on another stream must be synchronised by the caller.
        copy(host, device, i, cudaMemcpyDeviceToHost);
        out.emplace_back(host, gradients[i].size());
      }
    }
    if (!pass_through) synchronize();
  }

  // The aggregation's own device path, when it has one (see the top of this header):
  // returns false when it has none, and the caller stages through the host instead.
  template <class Aggregation, class Tr, class Gradient>
  bool step_in_device_memory(Aggregation& aggregation, collective::communicator<Tr>& comm,
                             std::span<Gradient> gradients, const Optimizer& optimizer) {
    using aggregation::device_step;
    using device_spans = std::span<const std::span<const V>>;
    auto apply_device = [&](std::size_t i, std::span<const V> g, V scale) {
      const V* grads[] = {g.data()};
      step_device(optimizer, states_[i], parameters_[i].data(), std::span<const V* const>(grads), g.size(), scale,
                  parameters_[i].stream());
    };
    if constexpr (requires { device_step(aggregation, comm, device_spans(), apply_device, workspace_, cudaStream_t{}); }) {
      if (comm.size() == 1 || parameters_.empty()) return false;  // nothing to reduce: apply straight away
      device_spans_.clear();
      for (std::size_t i = 0; i < gradients.size(); ++i) {
        device_spans_.emplace_back(gradients[i].data(), gradients[i].size());
        // The packing runs on the first tensor's stream, after every tensor's own work.
        if (i > 0) cuda::check(cudaStreamSynchronize(parameters_[i].stream()), "strategy: cudaStreamSynchronize");
      }
      device_step(aggregation, comm, device_spans(device_spans_), apply_device, workspace_, parameters_[0].stream());
      synchronize();
      return true;
    } else {
      return false;
    }
  }

  // The optimizer on the device for tensor i with `gradient` * scale; `gradient` is this
  // step's device gradient passed through, or host memory (a mirror or a reduced bucket).
  // Under a sharding agent, `gradient` is for this replica's slice of tensor i only.
  void apply(const Optimizer& optimizer, std::size_t i, std::span<const V> gradient, V scale, bool refresh_host) {
    const element_range r = stepped(i);
    if (gradient.size() != r.count)
      throw error(errc::invalid_argument, "strategy: the aggregation applied " + std::to_string(gradient.size()) +
                                              " gradient elements to parameter " + std::to_string(i) + " of " +
                                              std::to_string(r.count));
    const V* g = gradient.data();
    const bool passed_through = incoming_[i] != nullptr && g == incoming_[i] + r.offset;  // this step's device gradient
    if (!passed_through) {
      V* staged = device_gradients_.data() + offsets_[i] + r.offset;
      copy(staged, g, i, cudaMemcpyDefault, r);  // usually host memory; any kind works
      g = staged;
    }
    const V* grads[] = {g};
    step_device(optimizer, states_[i], parameters_[i].data() + r.offset, std::span<const V* const>(grads), r.count,
                scale, parameters_[i].stream());
    if (refresh_host) {
      copy(host_parameters(i).data() + r.offset, parameters_[i].data() + r.offset, i, cudaMemcpyDeviceToHost, r);
      cuda::check(cudaStreamSynchronize(parameters_[i].stream()), "strategy: cudaStreamSynchronize");
    }
  }

  // End of a step: the host mirror back to the device if the aggregation wrote it, and
  // every queued update finished (errors surface in this step, not in a later one).
  void finish_step(bool upload) {
    if (upload)
      upload_parameters();
    else
      synchronize();
  }

  // n elements of tensor i (all of them, unless `part` says which), on its stream.
  void copy(V* to, const V* from, std::size_t i, cudaMemcpyKind kind) {
    copy(to, from, i, kind, element_range{0, parameters_[i].size()});
  }
  void copy(V* to, const V* from, std::size_t i, cudaMemcpyKind kind, element_range part) {
    const std::size_t n = part.count;
    if (n)
      cuda::check(cudaMemcpyAsync(to, from, n * sizeof(V), kind, parameters_[i].stream()),
                  kind == cudaMemcpyDeviceToHost ? "strategy: copy to the host" : "strategy: copy to the device");
  }
  void synchronize() {
    for (auto& p : parameters_) cuda::check(cudaStreamSynchronize(p.stream()), "strategy: cudaStreamSynchronize");
  }

  std::span<Tensor> parameters_;
  std::vector<std::size_t> offsets_;
  cuda::pinned_buffer<V> host_parameters_, host_gradients_;
  cuda::device_buffer<V> device_gradients_;
  std::vector<state_type> states_;
  std::vector<element_range> owned_;  // [tensor]: what this replica steps, under a sharding agent (else empty)
  std::vector<const V*> incoming_;  // this step's device gradients
  std::vector<std::span<const V>> device_spans_;
  aggregation::device_workspace<V> workspace_;  // an aggregation's device path
  std::vector<std::span<V>> view_;               // the host mirror, a span per tensor
  std::vector<std::span<const V>> grad_spans_;   // this step's, as the aggregation sees them
};

static_assert(concepts::replica<device_replica<cuda_tensor<float>, optim::sgd>, cuda_tensor<float>, optim::sgd,
                                concepts::detail::transport_archetype> &&
              !concepts::incremental_replica<device_replica<cuda_tensor<float>, optim::sgd>, cuda_tensor<float>,
                                             optim::sgd, concepts::detail::transport_archetype>);

}  // namespace gradwire::training
