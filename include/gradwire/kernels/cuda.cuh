// Shared CUDA kernels: the host kernels' operations (sum of k buffers, average, scale, axpy, fused
// average + SGD / momentum / Adam / AdamW) on device memory, plus dtype conversion and a CUB norm.
//
// Layers, as in CUB: per-thread packs (16-byte loads and stores) -> one grid-stride
// kernel template whose element operation is a functor -> a dispatch that sizes the grid
// from the device and picks the vector path when every pointer is 16-byte aligned ->
// thin public entry points. Every operation is one pass over memory: the fused
// optimizer steps read the k gradient buffers, sum them, scale by grad_scale (the 1/N of
// averaging) and update parameters and state in the same pass. Arithmetic is in float
// for f16/bf16 and float, in double for double. All calls are asynchronous on `stream`.
#pragma once

#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "../cuda/element.cuh"
#include "../cuda/runtime.cuh"
#include "../error.hpp"
#include "host.hpp"  // adam_coefficients: the same per-step scalars on both sides

namespace gradwire::kernels::cuda {

using gradwire::cuda::compute_t;

// Gradient buffers one fused launch reads; more must be summed first (sum() chains).
inline constexpr int max_inputs = 16;
inline constexpr int block_threads = 256;

namespace detail {

// --- thread level: 16 bytes of T loaded and stored as one vector access ---------------
template <class T>
struct alignas(16) pack {
  static constexpr int lanes = 16 / static_cast<int>(sizeof(T));
  T v[lanes];
};

template <class T>
__device__ __forceinline__ pack<T> load(const T* p) {
  return *reinterpret_cast<const pack<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store(T* p, const pack<T>& x) {
  *reinterpret_cast<pack<T>*>(p) = x;
}

template <class T>
struct inputs {
  const T* p[max_inputs];
  int k;
};

// --- element operations: op(g, out, s1, s2), g = the sum of the inputs at one index ---
// `reads_out`: out's old value is loaded first; `states`: how many of s1, s2 it updates.
template <class C>
struct scaled_sum {  // out = alpha * g
  static constexpr bool reads_out = false;
  static constexpr int states = 0;
  C alpha;
  __device__ void operator()(C g, C& out, C&, C&) const { out = alpha * g; }
};

template <class C>
struct accumulate {  // out += alpha * g (axpy)
  static constexpr bool reads_out = true;
  static constexpr int states = 0;
  C alpha;
  __device__ void operator()(C g, C& out, C&, C&) const { out += alpha * g; }
};

template <class C>
struct sgd {  // p = keep*p - step*g,  keep = 1 - lr*wd,  step = lr*grad_scale
  static constexpr bool reads_out = true;
  static constexpr int states = 0;
  C keep, step;
  __device__ void operator()(C g, C& p, C&, C&) const { p = keep * p - step * g; }
};

template <class C, bool Nesterov>
struct momentum {  // d = s*g + wd*p;  v = mu*v + d;  p -= lr * (nesterov ? d + mu*v : v)
  static constexpr bool reads_out = true;
  static constexpr int states = 1;
  C lr, mu, weight_decay, grad_scale;
  __device__ void operator()(C g, C& p, C& v, C&) const {
    const C d = grad_scale * g + weight_decay * p;
    v = mu * v + d;
    p -= lr * (Nesterov ? d + mu * v : v);
  }
};

template <class C>
struct adam {  // as kernels::adam_step on the host
  static constexpr bool reads_out = true;
  static constexpr int states = 2;
  adam_coefficients<C> c;
  __device__ void operator()(C g, C& p, C& m, C& v) const {
    const C d = c.grad_scale * g + c.l2 * p;
    m = c.beta1 * m + (C(1) - c.beta1) * d;
    v = c.beta2 * v + (C(1) - c.beta2) * d * d;
    p = c.decay_keep * p - c.step_size * m / (sqrt(v) * c.inv_sqrt_bc2 + c.eps);
  }
};

// --- the kernel: grid-stride over 16-byte packs, then a scalar tail --------------------
template <class T, class Op>
__device__ __forceinline__ void update_one(const inputs<T>& in, T* out, T* s1, T* s2, std::size_t i, const Op& op) {
  using C = compute_t<T>;
  C g = C(0);
  for (int j = 0; j < in.k; ++j) g += gradwire::cuda::to_compute(in.p[j][i]);
  C o = Op::reads_out ? gradwire::cuda::to_compute(out[i]) : C(0);
  C a = Op::states >= 1 ? gradwire::cuda::to_compute(s1[i]) : C(0);
  C b = Op::states >= 2 ? gradwire::cuda::to_compute(s2[i]) : C(0);
  op(g, o, a, b);
  out[i] = gradwire::cuda::from_compute<T>(o);
  if constexpr (Op::states >= 1) s1[i] = gradwire::cuda::from_compute<T>(a);
  if constexpr (Op::states >= 2) s2[i] = gradwire::cuda::from_compute<T>(b);
}

template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    update_kernel(inputs<T> in, T* out, T* s1, T* s2, std::size_t n, bool vectorised, Op op) {
  using C = compute_t<T>;
  constexpr int lanes = pack<T>::lanes;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = vectorised ? n / lanes : 0;
  for (std::size_t v = first; v < packs; v += stride) {
    const std::size_t i = v * lanes;
    C g[lanes];
#pragma unroll
    for (int l = 0; l < lanes; ++l) g[l] = C(0);
    for (int j = 0; j < in.k; ++j) {
      const pack<T> x = load(in.p[j] + i);
#pragma unroll
      for (int l = 0; l < lanes; ++l) g[l] += gradwire::cuda::to_compute(x.v[l]);
    }
    pack<T> o{}, a{}, b{};
    if constexpr (Op::reads_out) o = load(out + i);
    if constexpr (Op::states >= 1) a = load(s1 + i);
    if constexpr (Op::states >= 2) b = load(s2 + i);
#pragma unroll
    for (int l = 0; l < lanes; ++l) {
      C oc = Op::reads_out ? gradwire::cuda::to_compute(o.v[l]) : C(0);
      C ac = Op::states >= 1 ? gradwire::cuda::to_compute(a.v[l]) : C(0);
      C bc = Op::states >= 2 ? gradwire::cuda::to_compute(b.v[l]) : C(0);
      op(g[l], oc, ac, bc);
      o.v[l] = gradwire::cuda::from_compute<T>(oc);
      if constexpr (Op::states >= 1) a.v[l] = gradwire::cuda::from_compute<T>(ac);
      if constexpr (Op::states >= 2) b.v[l] = gradwire::cuda::from_compute<T>(bc);
    }
    store(out + i, o);
    if constexpr (Op::states >= 1) store(s1 + i, a);
    if constexpr (Op::states >= 2) store(s2 + i, b);
  }
  for (std::size_t i = packs * lanes + first; i < n; i += stride) update_one(in, out, s1, s2, i, op);
}

template <class From, class To>
__global__ void __launch_bounds__(block_threads) convert_kernel(const From* in, To* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
  {
    if constexpr (std::is_same_v<From, double> && std::is_same_v<To, __half>)
      out[i] = __double2half(in[i]);  // one rounding, not double -> float -> half
    else if constexpr (std::is_same_v<From, double> && std::is_same_v<To, __nv_bfloat16>)
      out[i] = __double2bfloat16(in[i]);
    else
      out[i] = gradwire::cuda::from_compute<To>(static_cast<compute_t<To>>(gradwire::cuda::to_compute(in[i])));
  }
}

// --- dispatch -------------------------------------------------------------------------
inline bool aligned16(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Enough blocks to fill every SM several times over, no more: the grid-stride loop does
// the rest, so huge buffers cost no more launch overhead than small ones.
inline unsigned grid_for(std::size_t work) {
  const std::size_t wanted = (work + block_threads - 1) / block_threads;
  const std::size_t most =
      static_cast<std::size_t>(gradwire::cuda::multiprocessor_count(gradwire::cuda::current_device())) * 8;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, most)));
}

template <class T, class Op>
void launch_update(std::span<const T* const> grads, T* out, T* s1, T* s2, std::size_t n, const Op& op,
                   cudaStream_t stream, const char* what) {
  if (grads.size() > static_cast<std::size_t>(max_inputs))
    throw error(errc::invalid_argument, std::string(what) + ": " + std::to_string(grads.size()) +
                                            " input buffers, at most " + std::to_string(max_inputs) +
                                            " per launch (sum them first with kernels::cuda::sum)");
  if (n == 0) return;
  inputs<T> in{};
  in.k = static_cast<int>(grads.size());
  bool vectorised = aligned16(out) && (Op::states < 1 || aligned16(s1)) && (Op::states < 2 || aligned16(s2));
  for (std::size_t j = 0; j < grads.size(); ++j) {
    in.p[j] = grads[j];
    vectorised = vectorised && aligned16(grads[j]);
  }
  const std::size_t work = vectorised ? (n + pack<T>::lanes - 1) / pack<T>::lanes : n;
  update_kernel<T, Op><<<grid_for(work), block_threads, 0, stream>>>(in, out, s1, s2, n, vectorised, op);
  gradwire::cuda::check(cudaGetLastError(), what);
}

}  // namespace detail

// out = alpha * (inputs[0] + ... + inputs[k-1]); k may exceed max_inputs (launches
// chain, accumulating in out). `out` may be inputs[0] but no other input.
template <class T>
void sum(std::span<const T* const> inputs, T* out, std::size_t n, compute_t<T> alpha, cudaStream_t stream) {
  using C = compute_t<T>;
  if (inputs.empty()) {
    if (n) gradwire::cuda::check(cudaMemsetAsync(out, 0, n * sizeof(T), stream), "kernels::cuda::sum");
    return;
  }
  const T* chained[max_inputs];
  std::size_t next = 0;
  bool first = true;
  while (next < inputs.size()) {
    // Launches after the first read the running sum back from out as their input 0.
    std::size_t k = 0;
    if (!first) chained[k++] = out;
    while (k < static_cast<std::size_t>(max_inputs) && next < inputs.size()) chained[k++] = inputs[next++];
    const bool last = next == inputs.size();
    detail::launch_update<T>(std::span<const T* const>(chained, k), out, nullptr, nullptr, n,
                             detail::scaled_sum<C>{last ? alpha : C(1)}, stream, "kernels::cuda::sum");
    first = false;
  }
}
template <class T>
void sum(std::span<const T* const> inputs, T* out, std::size_t n, cudaStream_t stream) {
  sum(inputs, out, n, compute_t<T>(1), stream);
}

// out = mean of the k inputs (same aliasing rule as sum).
template <class T>
void average(std::span<const T* const> inputs, T* out, std::size_t n, cudaStream_t stream) {
  using C = compute_t<T>;
  sum(inputs, out, n, inputs.empty() ? C(1) : C(1) / static_cast<C>(inputs.size()), stream);
}

// x *= alpha
template <class T>
void scale(T* x, compute_t<T> alpha, std::size_t n, cudaStream_t stream) {
  const T* in[] = {x};
  detail::launch_update<T>(in, x, nullptr, nullptr, n, detail::scaled_sum<compute_t<T>>{alpha}, stream,
                           "kernels::cuda::scale");
}

// y += alpha * x
template <class T>
void axpy(compute_t<T> alpha, const T* x, T* y, std::size_t n, cudaStream_t stream) {
  const T* in[] = {x};
  detail::launch_update<T>(in, y, nullptr, nullptr, n, detail::accumulate<compute_t<T>>{alpha}, stream,
                           "kernels::cuda::axpy");
}

// --- fused average + optimizer steps: g = grad_scale * (grads[0] + ... + grads[k-1]) ---

// p -= lr * (g + wd*p)
template <class T>
void sgd_step(T* p, std::span<const T* const> grads, std::size_t n, double lr, double weight_decay,
              compute_t<T> grad_scale, cudaStream_t stream) {
  using C = compute_t<T>;
  detail::launch_update<T>(grads, p, nullptr, nullptr, n,
                           detail::sgd<C>{C(1.0 - lr * weight_decay), C(lr) * grad_scale}, stream,
                           "kernels::cuda::sgd_step");
}

// d = g + wd*p;  v = mu*v + d;  p -= lr * (nesterov ? d + mu*v : v)
template <class T>
void momentum_step(T* p, std::span<const T* const> grads, T* v, std::size_t n, double lr, double momentum,
                   double weight_decay, bool nesterov, compute_t<T> grad_scale, cudaStream_t stream) {
  using C = compute_t<T>;
  if (nesterov)
    detail::launch_update<T>(grads, p, v, nullptr, n,
                             detail::momentum<C, true>{C(lr), C(momentum), C(weight_decay), grad_scale}, stream,
                             "kernels::cuda::momentum_step");
  else
    detail::launch_update<T>(grads, p, v, nullptr, n,
                             detail::momentum<C, false>{C(lr), C(momentum), C(weight_decay), grad_scale}, stream,
                             "kernels::cuda::momentum_step");
}

// Adam / AdamW with the host's per-step scalars (adam_coefficients::make; its grad_scale
// applies to the sum of the k gradients).
template <class T>
void adam_step(T* p, std::span<const T* const> grads, T* m, T* v, std::size_t n,
               const adam_coefficients<compute_t<T>>& c, cudaStream_t stream) {
  detail::launch_update<T>(grads, p, m, v, n, detail::adam<compute_t<T>>{c}, stream, "kernels::cuda::adam_step");
}

// --- compressed transfer: fp32 <-> fp16 / bf16 (round to nearest even) ------------------
template <class From, class To>
void convert(const From* in, To* out, std::size_t n, cudaStream_t stream) {
  static_assert(gradwire::cuda::is_device_element_v<From> && gradwire::cuda::is_device_element_v<To>,
                "kernels::cuda::convert: float, double, __half or __nv_bfloat16");
  if (n == 0) return;
  detail::convert_kernel<From, To><<<detail::grid_for(n), block_threads, 0, stream>>>(in, out, n);
  gradwire::cuda::check(cudaGetLastError(), "kernels::cuda::convert");
}

// --- reductions: CUB, the right tool for a full reduction over one buffer --------------
namespace detail {
template <class T>
struct square {
  __host__ __device__ double operator()(T x) const {
    const double d = static_cast<double>(gradwire::cuda::to_compute(x));
    return d * d;
  }
};
}  // namespace detail

// *out_device = sum of x[i]^2, accumulated in double (gradient clipping by global norm
// sums these over tensors). `scratch` holds CUB's temporary storage across calls.
template <class T>
void squared_norm(const T* x, std::size_t n, double* out_device, gradwire::cuda::device_buffer<std::byte>& scratch,
                  cudaStream_t stream) {
  std::size_t bytes = 0;
  gradwire::cuda::check(cub::DeviceReduce::TransformReduce(nullptr, bytes, x, out_device, n, ::cuda::std::plus<double>{},
                                                           detail::square<T>{}, 0.0, stream),
                        "kernels::cuda::squared_norm (size query)");
  scratch.reserve_discard(bytes, stream);  // allocated and freed in order with the reduction
  gradwire::cuda::check(cub::DeviceReduce::TransformReduce(scratch.data(), bytes, x, out_device, n,
                                                           ::cuda::std::plus<double>{}, detail::square<T>{}, 0.0,
                                                           stream),
                        "kernels::cuda::squared_norm");
}

}  // namespace gradwire::kernels::cuda
