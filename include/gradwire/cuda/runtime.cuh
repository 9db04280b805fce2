// The CUDA runtime, RAII-wrapped: error checks, streams, events, pinned host buffers, device queries.
//
// Device code and everything that names a CUDA type lives in *.cuh headers, included
// only by translation units that nvcc compiles; host-only builds never see CUDA headers.
#pragma once

#if !defined(__CUDACC__)
#error "gradwire/cuda/*.cuh needs nvcc: compile this translation unit as CUDA (a .cu file, or LANGUAGE CUDA)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace gradwire::cuda {

// Throws gradwire::error(errc::device) naming the call and the runtime's reason. The
// runtime also keeps a failure as its "last error" (cleared here unless it is sticky):
// left there, the next kernel launch, checked with cudaGetLastError(), would report it.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw error(errc::device, std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                                  cudaGetErrorString(status) + ")");
  }
}

// Devices this process can use; 0 when there is no GPU or no driver (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

inline int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

// Streaming multiprocessors of a device, asked once per device: kernel launches size
// their grids from it and must not pay a driver call each time.
inline int multiprocessor_count(int device) {
  static std::mutex lock;
  static std::vector<int> known;
  std::lock_guard guard(lock);
  if (device >= static_cast<int>(known.size())) known.resize(static_cast<std::size_t>(device) + 1, 0);
  int& n = known[static_cast<std::size_t>(device)];
  if (n == 0) check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return n;
}

// Where a pointer's memory lives, as the runtime sees it.
inline cudaMemoryType memory_type_of(const void* p) {
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
  return attributes.type;
}

namespace detail {
// Owns one runtime handle (a stream, an event): move-only, destroyed with Destroy.
template <class Handle, cudaError_t (*Destroy)(Handle)>
class owned_handle {
 public:
  owned_handle() = default;
  owned_handle(const owned_handle&) = delete;
  owned_handle& operator=(const owned_handle&) = delete;
  owned_handle(owned_handle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  owned_handle& operator=(owned_handle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~owned_handle() { reset(); }

  Handle get() const noexcept { return handle_; }

 protected:
  Handle handle_ = nullptr;

 private:
  void reset() noexcept {
    if (handle_) (void)Destroy(handle_);
    handle_ = nullptr;
  }
};
}  // namespace detail

// An owned, non-blocking stream (does not synchronise with the legacy default stream).
class stream : public detail::owned_handle<cudaStream_t, &cudaStreamDestroy> {
 public:
  stream() { check(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }

  operator cudaStream_t() const noexcept { return handle_; }  // NOLINT: passes where the runtime wants one
  void synchronize() const { check(cudaStreamSynchronize(handle_), "cudaStreamSynchronize"); }
};

// An event without timing, for ordering one stream after another or the host after a stream.
class event : public detail::owned_handle<cudaEvent_t, &cudaEventDestroy> {
 public:
  explicit event(bool timing = false) {
    check(cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
  }

  void record(cudaStream_t s) { check(cudaEventRecord(handle_, s), "cudaEventRecord"); }
  void synchronize() const { check(cudaEventSynchronize(handle_), "cudaEventSynchronize"); }
  // Later work on `s` waits for this event (on the device; the host does not block).
  void make_wait(cudaStream_t s) const { check(cudaStreamWaitEvent(s, handle_, 0), "cudaStreamWaitEvent"); }
  // Milliseconds from `start` to this event (both recorded with timing on).
  float elapsed_since(const event& start) const {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.handle_, handle_), "cudaEventElapsedTime");
    return ms;
  }
};

// Page-locked host memory: the staging area copies to and from the device run
// asynchronously from (pageable memory makes cudaMemcpyAsync synchronous).
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t count) : size_(count) {
    if (count) {
      void* p = nullptr;
      check(cudaMallocHost(&p, count * sizeof(T)), "cudaMallocHost");
      data_ = static_cast<T*>(p);
    }
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  pinned_buffer(pinned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~pinned_buffer() { reset(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<T> span() noexcept { return {data_, size_}; }
  // Grow-only, like aligned_buffer: pinning is expensive, so a reused buffer pins once.
  void reserve_discard(std::size_t count) {
    if (count > size_) *this = pinned_buffer(count);
  }

 private:
  void reset() noexcept {
    if (data_) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Grow-only device scratch from the stream-ordered allocator (CUB's temporary storage,
// staging areas): allocated on first use, reused across calls, freed on its stream.
template <class T>
class device_buffer {
 public:
  explicit device_buffer(cudaStream_t stream = nullptr) : stream_(stream) {}
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& other) noexcept
      : stream_(other.stream_), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = other.stream_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~device_buffer() { reset(); }

  T* data() noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  cudaStream_t stream() const noexcept { return stream_; }
  // Grows on `on` from now on (freed there too): for scratch used by work on that stream.
  void reserve_discard(std::size_t count, cudaStream_t on) {
    if (count <= size_) return;
    reset();
    stream_ = on;
    reserve_discard(count);
  }
  void reserve_discard(std::size_t count) {
    if (count <= size_) return;
    reset();
    void* p = nullptr;
    check(cudaMallocAsync(&p, count * sizeof(T), stream_), "device_buffer: cudaMallocAsync");
    data_ = static_cast<T*>(p);
    size_ = count;
  }

 private:
  void reset() noexcept {
    if (data_) (void)cudaFreeAsync(data_, stream_);
    data_ = nullptr;
    size_ = 0;
  }
  cudaStream_t stream_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gradwire::cuda
