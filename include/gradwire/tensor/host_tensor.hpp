// host_tensor owns aligned host memory; tensor_view is a non-owning view over anyone's memory.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "../error.hpp"
#include "aligned_buffer.hpp"
#include "dtype.hpp"
#include "shape.hpp"

namespace gradwire {

// Owning host tensor: 64-byte aligned, zero-initialised.
template <class T>
class host_tensor {
  static_assert(std::is_floating_point_v<T>, "host_tensor<T>: T must be float or double");

 public:
  using value_type = T;
  static constexpr memory_location location = memory_location::host;

  host_tensor() = default;
  explicit host_tensor(gradwire::shape s) : shape_(std::move(s)), storage_(shape_.elements()) {}
  host_tensor(const host_tensor&) = default;
  host_tensor& operator=(const host_tensor&) = default;
  // A moved-from tensor is empty: shape [0], no storage.
  host_tensor(host_tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, empty_shape())), storage_(std::move(other.storage_)) {}
  host_tensor& operator=(host_tensor&& other) noexcept {
    shape_ = std::exchange(other.shape_, empty_shape());
    storage_ = std::move(other.storage_);
    return *this;
  }

  T* data() noexcept { return storage_.data(); }
  const T* data() const noexcept { return storage_.data(); }
  std::size_t size() const noexcept { return storage_.size(); }
  const gradwire::shape& shape() const noexcept { return shape_; }
  std::span<T> span() noexcept { return storage_.span(); }
  std::span<const T> span() const noexcept { return storage_.span(); }
  T& operator[](std::size_t i) noexcept { return storage_.data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return storage_.data()[i]; }

 private:
  static gradwire::shape empty_shape() { return gradwire::shape{0}; }
  gradwire::shape shape_ = empty_shape();
  aligned_buffer<T> storage_;
};

// Non-owning view over memory someone else owns (an Eigen matrix, a LibTorch tensor,
// a std::vector). The owner must outlive the view. T may be const for read-only views.
template <class T>
class tensor_view {
  static_assert(std::is_floating_point_v<std::remove_const_t<T>>, "tensor_view<T>: T must be float or double");

 public:
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  static constexpr memory_location location = memory_location::host;

  tensor_view() = default;
  tensor_view(T* data, gradwire::shape s) : data_(data), shape_(std::move(s)) {
    if (data_ == nullptr && shape_.elements() != 0)
      throw error(errc::invalid_argument, "tensor_view: null data for shape " + shape_.to_string());
  }
  // A flat view over a span.
  explicit tensor_view(std::span<T> s) : data_(s.data()), shape_({s.size()}) {}
  // Views of owning tensors (const tensors give const views).
  template <class U>
    requires std::is_convertible_v<U*, T*>
  tensor_view(host_tensor<U>& t) : data_(t.data()), shape_(t.shape()) {}  // NOLINT: implicit like std::span
  template <class U>
    requires std::is_convertible_v<const U*, T*>
  tensor_view(const host_tensor<U>& t) : data_(t.data()), shape_(t.shape()) {}  // NOLINT

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return shape_.elements(); }
  const gradwire::shape& shape() const noexcept { return shape_; }
  std::span<T> span() const noexcept { return {data_, size()}; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  T* data_ = nullptr;
  gradwire::shape shape_{0};  // default: empty, not a rank-0 scalar
};

}  // namespace gradwire
