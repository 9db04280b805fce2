// The optimizers' device paths: per-tensor state in device memory and a fused step on the CUDA kernels.
//
// An optimizer runs on the device when three things exist for it (found by ADL, so a
// user's optimizer provides them in its own namespace and composes like these):
//   optim::device_state<O, T>                         its state for one tensor (moments, step count)
//   void init_device(const O&, device_state<O, T>& fresh, size_t n, cudaStream_t)
// (device_state carries O as a template argument, so ADL looks in O's namespace too.)
//   void step_device(const O&, device_state<O, T>&, T* params, span<const T* const> grads,
//                    size_t n, T grad_scale, cudaStream_t)
//     params -= update(grad_scale * (grads[0] + ... + grads[k-1])), on the stream
// (concepts::device_optimizer_on<O, T, cudaStream_t> in concepts.hpp; device_optimizer<O, T> below).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "../kernels/cuda.cuh"
#include "../tensor/cuda_tensor.cuh"
#include "adam.hpp"
#include "momentum.hpp"
#include "sgd.hpp"
#include "validate.hpp"

namespace gradwire::optim {

template <class O, class T>
struct device_state;  // specialised per optimizer below

template <class T>
struct device_state<sgd, T> {
  std::size_t size = 0;
};
template <class T>
struct device_state<momentum, T> {
  cuda_tensor<T> velocity;
};
template <bool Decoupled, class T>
struct device_state<detail::adam_family<Decoupled>, T> {
  cuda_tensor<T> m, v;
  long step = 0;
};

template <class T>
void init_device(const sgd&, device_state<sgd, T>& fresh, std::size_t n, cudaStream_t) {
  fresh = {n};
}
template <class T>
void init_device(const momentum&, device_state<momentum, T>& fresh, std::size_t n, cudaStream_t stream) {
  fresh.velocity = cuda_tensor<T>(shape{n}, stream);
}
template <class T, bool Decoupled>
void init_device(const detail::adam_family<Decoupled>&, device_state<detail::adam_family<Decoupled>, T>& fresh,
                 std::size_t n, cudaStream_t stream) {
  fresh.m = cuda_tensor<T>(shape{n}, stream);
  fresh.v = cuda_tensor<T>(shape{n}, stream);
  fresh.step = 0;
}

template <class T>
void step_device(const sgd& o, device_state<sgd, T>& s, T* params, std::span<const T* const> grads, std::size_t n,
                 T grad_scale, cudaStream_t stream) {
  detail::require_same_size("sgd", n, n, s.size);
  kernels::cuda::sgd_step<T>(params, grads, n, o.settings().lr, o.settings().weight_decay, grad_scale, stream);
}

template <class T>
void step_device(const momentum& o, device_state<momentum, T>& s, T* params, std::span<const T* const> grads,
                 std::size_t n, T grad_scale, cudaStream_t stream) {
  detail::require_same_size("momentum", n, n, s.velocity.size());
  const auto& h = o.settings();
  kernels::cuda::momentum_step<T>(params, grads, s.velocity.data(), n, h.lr, h.momentum, h.weight_decay, h.nesterov,
                                  grad_scale, stream);
}

template <class T, bool Decoupled>
void step_device(const detail::adam_family<Decoupled>& o, device_state<detail::adam_family<Decoupled>, T>& s,
                 T* params, std::span<const T* const> grads, std::size_t n, T grad_scale, cudaStream_t stream) {
  detail::require_same_size(detail::adam_family<Decoupled>::name, n, n, s.m.size());
  ++s.step;
  const auto& h = o.settings();
  const auto c = kernels::adam_coefficients<T>::make(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, Decoupled, s.step,
                                                     grad_scale);
  kernels::cuda::adam_step<T>(params, grads, s.m.data(), s.v.data(), n, c, stream);
}

}  // namespace gradwire::optim

namespace gradwire::concepts {

// concepts::device_optimizer_on (concepts.hpp, which needs no CUDA) on CUDA's streams: an
// optimizer with a device path. Not a seam of its own: it names the stream type only.
template <class O, class V>
concept device_optimizer = device_optimizer_on<O, V, cudaStream_t>;

static_assert(device_optimizer<optim::adam, float> && device_optimizer<optim::sgd, double> &&
              device_optimizer<optim::momentum, float> && device_optimizer<optim::adamw, float>);

}  // namespace gradwire::concepts
