// Element types gradwire moves and reduces, and their names for error messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gradwire {

enum class dtype : std::uint8_t { f32, f64, f16, bf16 };

inline constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::f16:
    case dtype::bf16: return 2;
  }
  return 0;
}

inline constexpr const char* name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "?";
}

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};

template <class T>
inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

// Where a tensor's memory lives; decides which kernels (host or CUDA) run on it.
enum class memory_location : std::uint8_t { host, cuda };

}  // namespace gradwire
