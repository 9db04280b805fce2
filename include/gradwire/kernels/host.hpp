// Shared host kernels: sum, average, scale, axpy and fused optimizer steps, written for the auto-vectoriser.
//
// Every loop is a straight pass over restrict-qualified pointers with no calls and no
// branches inside. GCC vectorises such loops at -O3; at -O2 its cheap cost model
// refuses loops that need a scalar remainder, so each loop also carries `omp simd`,
// honoured under -fopenmp-simd (set, with -fno-math-errno, by the gradwire::gradwire
// target; checked with -fopt-info-vec, see the README). Each optimizer step is one fused pass over memory and takes a
// grad_scale, so the 1/N of gradient averaging costs no extra pass.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "flush_denormals.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define GRADWIRE_RESTRICT __restrict__
#else
#define GRADWIRE_RESTRICT
#endif

#if defined(GRADWIRE_OPENMP_SIMD)
#define GRADWIRE_VECTORIZE _Pragma("omp simd")
#define GRADWIRE_PRAGMA(x) _Pragma(#x)
// A loop whose only carried value is `flag |= ...` (a reduction the clause declares).
#define GRADWIRE_VECTORIZE_OR(flag) GRADWIRE_PRAGMA(omp simd reduction(| : flag))
#else
#define GRADWIRE_VECTORIZE
#define GRADWIRE_VECTORIZE_OR(flag)
#endif

namespace gradwire::kernels {

// dst[i] += src[i]
template <class T>
void add(T* GRADWIRE_RESTRICT dst, const T* GRADWIRE_RESTRICT src, std::size_t n) noexcept {
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// dst[i] = a[i] + b[i]
template <class T>
void add(T* GRADWIRE_RESTRICT dst, const T* GRADWIRE_RESTRICT a, const T* GRADWIRE_RESTRICT b, std::size_t n) noexcept {
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

// x[i] *= alpha
template <class T>
void scale(T* GRADWIRE_RESTRICT x, T alpha, std::size_t n) noexcept {
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) x[i] *= alpha;
}

// y[i] += alpha * x[i]
template <class T>
void axpy(T alpha, const T* GRADWIRE_RESTRICT x, T* GRADWIRE_RESTRICT y, std::size_t n) noexcept {
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// out = alpha * (inputs[0] + ... + inputs[k-1]). `out` may be inputs[0] (in-place
// accumulation) but must not overlap any other input. Works block by block so the
// partial sums stay in L1 while the k inputs stream through once each.
template <class T>
void sum(std::span<const T* const> inputs, T* out, std::size_t n, T alpha = T(1)) noexcept {
  constexpr std::size_t block = 2048;
  const std::size_t k = inputs.size();
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    T* o = out + begin;
    std::size_t next = 1;
    if (k == 0) {
      std::fill(o, o + len, T(0));
    } else if (inputs[0] == out) {
      // in place: out already holds inputs[0]
    } else if (k >= 2) {
      add(o, inputs[0] + begin, inputs[1] + begin, len);
      next = 2;
    } else {
      std::memcpy(o, inputs[0] + begin, len * sizeof(T));
    }
    for (std::size_t j = next; j < k; ++j) add(o, inputs[j] + begin, len);
    if (alpha != T(1)) scale(o, alpha, len);
  }
}

// out = mean of the k inputs (same aliasing rule as sum).
template <class T>
void average(std::span<const T* const> inputs, T* out, std::size_t n) noexcept {
  if (inputs.empty()) return sum(inputs, out, n);
  sum(inputs, out, n, T(1) / static_cast<T>(inputs.size()));
}

// Whether the n elements at x hold a NaN or an infinity: one vectorised pass that ORs together, per
// element, whether its exponent bits are all ones (what NaN and +-inf share, and no
// finite value has). Integer work only, so -ffast-math (which may assume no NaNs and
// fold std::isnan away) cannot remove it.
template <class T>
bool any_non_finite(const T* GRADWIRE_RESTRICT x, std::size_t n) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "any_non_finite: float or double");
  using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr bits exponent = sizeof(T) == 4 ? bits(0x7f800000u) : bits(0x7ff0000000000000ull);
  bits found = 0;
  GRADWIRE_VECTORIZE_OR(found)
  for (std::size_t i = 0; i < n; ++i) found |= bits((std::bit_cast<bits>(x[i]) & exponent) == exponent);
  return found != 0;
}

// The index of the first NaN or infinity among the n elements at x, or n when every element is finite.
// Blocks of 16 KiB (L1-sized) are scanned with any_non_finite; only a block that has
// one is searched element by element, so the common all-finite case is one pass.
template <class T>
std::size_t first_non_finite(const T* x, std::size_t n) noexcept {
  constexpr std::size_t block = 16384 / sizeof(T);
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    if (!any_non_finite(x + begin, len)) continue;
    for (std::size_t i = begin; i < begin + len; ++i)
      if (!std::isfinite(x[i])) return i;
  }
  return n;
}

// --- fused optimizer steps (PyTorch semantics; g is scaled by grad_scale first) ---
// Each runs with denormals flushed to zero (flush_denormals.hpp): state that decays toward
// zero would otherwise slow a step down up to 40x. The caller's floating-point mode is restored.

// p -= lr * (s*g + wd*p)
template <class T>
void sgd_step(T* GRADWIRE_RESTRICT p, const T* GRADWIRE_RESTRICT g, std::size_t n, T lr, T weight_decay,
              T grad_scale) noexcept {
  const T keep = T(1) - lr * weight_decay;
  const T step = lr * grad_scale;
  const flush_denormals no_denormals;
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) p[i] = keep * p[i] - step * g[i];
}

// d = s*g + wd*p;  v = mu*v + d;  p -= lr * (nesterov ? d + mu*v : v)
template <class T, bool Nesterov>
void momentum_step(T* GRADWIRE_RESTRICT p, const T* GRADWIRE_RESTRICT g, T* GRADWIRE_RESTRICT v, std::size_t n, T lr,
                   T momentum, T weight_decay, T grad_scale) noexcept {
  const flush_denormals no_denormals;
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) {
    const T d = grad_scale * g[i] + weight_decay * p[i];
    const T vi = momentum * v[i] + d;
    v[i] = vi;
    p[i] -= lr * (Nesterov ? d + momentum * vi : vi);
  }
}

template <class T>
void momentum_step(T* p, const T* g, T* v, std::size_t n, T lr, T momentum, T weight_decay, bool nesterov,
                   T grad_scale) noexcept {
  if (nesterov)
    momentum_step<T, true>(p, g, v, n, lr, momentum, weight_decay, grad_scale);
  else
    momentum_step<T, false>(p, g, v, n, lr, momentum, weight_decay, grad_scale);
}

// Per-step scalars of Adam/AdamW, computed once per step rather than per element.
template <class T>
struct adam_coefficients {
  T beta1, beta2, eps;
  T step_size;         // lr / (1 - beta1^t)
  T inv_sqrt_bc2;      // 1 / sqrt(1 - beta2^t)
  T l2;                // Adam's weight decay: added to the gradient
  T decay_keep;        // AdamW's decoupled decay: p *= 1 - lr*wd
  T grad_scale;

  // The per-step scalars are computed in double from the hyperparameters as given, as
  // PyTorch does: 1 - beta2^t from a beta2 already rounded to float is off by ~1e-4
  // relative at t = 1 for beta2 = 0.9999.
  static adam_coefficients make(double lr, double beta1, double beta2, double eps, double weight_decay,
                                bool decoupled, long step, T grad_scale) noexcept {
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    return {T(beta1),
            T(beta2),
            T(eps),
            T(lr / bc1),
            T(1.0 / std::sqrt(bc2)),
            decoupled ? T(0) : T(weight_decay),
            decoupled ? T(1.0 - lr * weight_decay) : T(1),
            grad_scale};
  }
};

// d = s*g + l2*p;  m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d^2;
// p = keep*p - step_size * m / (sqrt(v)/sqrt(bc2) + eps)
template <class T>
void adam_step(T* GRADWIRE_RESTRICT p, const T* GRADWIRE_RESTRICT g, T* GRADWIRE_RESTRICT m, T* GRADWIRE_RESTRICT v,
               std::size_t n, const adam_coefficients<T>& c) noexcept {
  const T b1 = c.beta1, b2 = c.beta2, one_b1 = T(1) - c.beta1, one_b2 = T(1) - c.beta2;
  const T eps = c.eps, step_size = c.step_size, inv_sqrt_bc2 = c.inv_sqrt_bc2, l2 = c.l2, keep = c.decay_keep,
          s = c.grad_scale;
  const flush_denormals no_denormals;
  GRADWIRE_VECTORIZE
  for (std::size_t i = 0; i < n; ++i) {
    const T d = s * g[i] + l2 * p[i];
    const T mi = b1 * m[i] + one_b1 * d;
    const T vi = b2 * v[i] + one_b2 * d * d;
    m[i] = mi;
    v[i] = vi;
    // Vectorises only under -fno-math-errno (the gradwire::gradwire target sets it):
    // otherwise std::sqrt keeps a branch to set errno and the loop stays scalar.
    p[i] = keep * p[i] - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace gradwire::kernels
