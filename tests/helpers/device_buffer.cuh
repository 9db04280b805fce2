// Test support for device code: guarded device buffers (canaries on both sides, NaN poison), host round trips.
#pragma once

#include <gradwire/cuda/element.cuh>
#include <gradwire/cuda/runtime.cuh>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace gradwire::test {

// n elements of T on the device, `offset` elements past a 256-byte boundary (offset 0:
// the kernels' vector path; others: the scalar path), with canaries on both sides, like
// guarded_buffer on the host. Independent of gradwire's own device allocators on purpose.
template <class T>
class device_guarded {
 public:
  static constexpr std::size_t guard = 64;

  explicit device_guarded(std::size_t n, std::size_t offset = 0) : n_(n), begin_(guard + offset), total_(guard + offset + n + guard) {
    void* p = nullptr;
    cuda::check(cudaMalloc(&p, total_ * sizeof(T)), "device_guarded: cudaMalloc");
    base_ = static_cast<T*>(p);
    const std::vector<T> fill(total_, canary());
    cuda::check(cudaMemcpy(base_, fill.data(), total_ * sizeof(T), cudaMemcpyHostToDevice), "device_guarded: fill");
  }
  device_guarded(const device_guarded&) = delete;
  device_guarded& operator=(const device_guarded&) = delete;
  ~device_guarded() { (void)cudaFree(base_); }

  static T canary() { return cuda::from_compute<T>(static_cast<cuda::compute_t<T>>(-9876.5)); }  // exact in all four

  T* data() noexcept { return base_ + begin_; }
  const T* data() const noexcept { return base_ + begin_; }
  std::size_t size() const noexcept { return n_; }

  void upload(std::span<const T> values) {
    if (n_) cuda::check(cudaMemcpy(data(), values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  // Quiet NaN everywhere in the payload: an element a kernel never writes stays NaN.
  void poison() {
    const std::vector<T> nan(n_, cuda::from_compute<T>(std::numeric_limits<cuda::compute_t<T>>::quiet_NaN()));
    upload(nan);
  }
  // Waits for the device, then copies the payload back.
  std::vector<T> download() const {
    cuda::check(cudaDeviceSynchronize(), "device work before download");
    std::vector<T> out(n_);
    if (n_) cuda::check(cudaMemcpy(out.data(), data(), n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  // True when nothing before or after the payload was written.
  bool intact() const {
    cuda::check(cudaDeviceSynchronize(), "device work before intact()");
    std::vector<T> all(total_);
    cuda::check(cudaMemcpy(all.data(), base_, total_ * sizeof(T), cudaMemcpyDeviceToHost), "intact");
    const double c = cuda::to_compute(canary());
    for (std::size_t i = 0; i < total_; ++i)
      if ((i < begin_ || i >= begin_ + n_) && static_cast<double>(cuda::to_compute(all[i])) != c) return false;
    return true;
  }

 private:
  std::size_t n_, begin_, total_;
  T* base_ = nullptr;
};

template <class T>
std::vector<double> widen_device(const std::vector<T>& x) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(cuda::to_compute(x[i]));
  return out;
}

}  // namespace gradwire::test
