// How a received message lands in the receiver's memory: copied, or added (fused receive-and-reduce).
#pragma once

#include <cstddef>
#include <cstring>

#include "../../kernels/host.hpp"

namespace gradwire::transport::detail {

// Delivers `bytes` from `from` into `to`.
using deliver_fn = void (*)(std::byte* to, const std::byte* from, std::size_t bytes) noexcept;

inline void deliver_copy(std::byte* to, const std::byte* from, std::size_t bytes) noexcept {
  std::memcpy(to, from, bytes);
}

// to[i] += from[i] over elements of V: what async_recv_accumulate delivers with.
template <class V>
void deliver_accumulate(std::byte* to, const std::byte* from, std::size_t bytes) noexcept {
  kernels::add(reinterpret_cast<V*>(to), reinterpret_cast<const V*>(from), bytes / sizeof(V));
}

}  // namespace gradwire::transport::detail
