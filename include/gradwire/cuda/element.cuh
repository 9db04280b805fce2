// Device element types: f16 and bf16 beside float and double, their dtypes, and float conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../tensor/dtype.hpp"

namespace gradwire {

template <>
struct dtype_of<__half> : std::integral_constant<dtype, dtype::f16> {};
template <>
struct dtype_of<__nv_bfloat16> : std::integral_constant<dtype, dtype::bf16> {};

namespace cuda {

// Element types device tensors and kernels take.
template <class T>
inline constexpr bool is_device_element_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                            std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Arithmetic happens in float for the 16-bit types (as in PyTorch's fused kernels) and
// in the type itself otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__host__ __device__ inline compute_t<T> to_compute(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return x;
}

template <class T>
__host__ __device__ inline T from_compute(compute_t<T> x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

}  // namespace cuda
}  // namespace gradwire
