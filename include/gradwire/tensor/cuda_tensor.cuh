// cuda_tensor owns device memory (stream-ordered); cuda_tensor_view views anyone's device memory.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "../cuda/element.cuh"
#include "../cuda/runtime.cuh"
#include "../error.hpp"
#include "shape.hpp"

namespace gradwire {

namespace detail {
// A host span must hold exactly a tensor's elements to be copied to or from it.
inline void require_same_elements(const char* what, std::size_t tensor, std::size_t host) {
  if (tensor != host)
    throw error(errc::invalid_argument, std::string(what) + ": the tensor has " + std::to_string(tensor) +
                                            " elements but the host span " + std::to_string(host));
}
}  // namespace detail

// Owning device tensor: memory from the stream-ordered allocator (cudaMallocAsync) on
// `stream`, zeroed, and freed on the same stream, so allocation and release order with
// the work queued there. Kernels and copies that gradwire runs for this tensor go on its
// stream. T: float, double, __half or __nv_bfloat16.
template <class T>
class cuda_tensor {
  static_assert(cuda::is_device_element_v<T>, "cuda_tensor<T>: T must be float, double, __half or __nv_bfloat16");

 public:
  using value_type = T;
  static constexpr memory_location location = memory_location::cuda;

  cuda_tensor() = default;
  explicit cuda_tensor(gradwire::shape s, cudaStream_t stream = nullptr) : shape_(std::move(s)), stream_(stream) {
    const std::size_t bytes = size() * sizeof(T);
    if (bytes == 0) return;
    void* p = nullptr;
    cuda::check(cudaMallocAsync(&p, bytes, stream_), "cuda_tensor: cudaMallocAsync");
    data_ = static_cast<T*>(p);
    cuda::check(cudaMemsetAsync(data_, 0, bytes, stream_), "cuda_tensor: cudaMemsetAsync");
  }
  // From host values (copied; the call returns once they are on the device).
  cuda_tensor(gradwire::shape s, std::span<const T> values, cudaStream_t stream = nullptr)
      : cuda_tensor(std::move(s), stream) {
    copy_from_host(values);
  }
  // A deep copy on the other's stream.
  cuda_tensor(const cuda_tensor& other) : cuda_tensor(other.shape_, other.stream_) {
    if (size())
      cuda::check(cudaMemcpyAsync(data_, other.data_, size() * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                  "cuda_tensor: cudaMemcpyAsync");
  }
  cuda_tensor& operator=(const cuda_tensor& other) {
    if (this != &other) *this = cuda_tensor(other);
    return *this;
  }
  // A moved-from tensor is empty: shape [0], no memory.
  cuda_tensor(cuda_tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, gradwire::shape{0})),
        stream_(other.stream_),
        data_(std::exchange(other.data_, nullptr)) {}
  cuda_tensor& operator=(cuda_tensor&& other) noexcept {
    if (this != &other) {
      release();
      shape_ = std::exchange(other.shape_, gradwire::shape{0});
      stream_ = other.stream_;
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  ~cuda_tensor() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return shape_.elements(); }
  const gradwire::shape& shape() const noexcept { return shape_; }
  cudaStream_t stream() const noexcept { return stream_; }

  // Blocking copies between the tensor and host memory, ordered on the tensor's stream.
  void copy_from_host(std::span<const T> host) {
    detail::require_same_elements("cuda_tensor::copy_from_host", size(), host.size());
    if (!size()) return;
    cuda::check(cudaMemcpyAsync(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_),
                "cuda_tensor: cudaMemcpyAsync to the device");
    cuda::check(cudaStreamSynchronize(stream_), "cuda_tensor: cudaStreamSynchronize");
  }
  void copy_to_host(std::span<T> host) const {
    detail::require_same_elements("cuda_tensor::copy_to_host", size(), host.size());
    if (!size()) return;
    cuda::check(cudaMemcpyAsync(host.data(), data_, host.size_bytes(), cudaMemcpyDeviceToHost, stream_),
                "cuda_tensor: cudaMemcpyAsync to the host");
    cuda::check(cudaStreamSynchronize(stream_), "cuda_tensor: cudaStreamSynchronize");
  }

 private:
  void release() noexcept {
    if (data_) (void)cudaFreeAsync(data_, stream_);  // a destructor must not throw
    data_ = nullptr;
  }

  gradwire::shape shape_{0};
  cudaStream_t stream_ = nullptr;
  T* data_ = nullptr;
};

// Non-owning view over device memory someone else owns (a LibTorch or CuPy tensor's
// buffer), with the stream its owner orders work on. The owner must outlive the view.
// A host pointer is refused at construction: kernels would fault on it.
template <class T>
class cuda_tensor_view {
  static_assert(cuda::is_device_element_v<T>,
                "cuda_tensor_view<T>: T must be float, double, __half or __nv_bfloat16");

 public:
  using value_type = T;
  static constexpr memory_location location = memory_location::cuda;

  cuda_tensor_view() = default;
  cuda_tensor_view(T* data, gradwire::shape s, cudaStream_t stream = nullptr)
      : data_(data), shape_(std::move(s)), stream_(stream) {
    if (shape_.elements() == 0) return;
    if (data_ == nullptr)
      throw error(errc::invalid_argument, "cuda_tensor_view: null data for shape " + shape_.to_string());
    const cudaMemoryType type = cuda::memory_type_of(data_);
    if (type != cudaMemoryTypeDevice && type != cudaMemoryTypeManaged)
      throw error(errc::invalid_argument,
                  "cuda_tensor_view: the pointer is not device or managed memory (host memory wants tensor_view)");
  }
  cuda_tensor_view(cuda_tensor<T>& t)  // NOLINT: implicit, like std::span from a container
      : data_(t.data()), shape_(t.shape()), stream_(t.stream()) {}

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return shape_.elements(); }
  const gradwire::shape& shape() const noexcept { return shape_; }
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  T* data_ = nullptr;
  gradwire::shape shape_{0};
  cudaStream_t stream_ = nullptr;
};

}  // namespace gradwire
