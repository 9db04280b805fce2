// Owning, 64-byte aligned, value-initialised storage: the memory behind host tensors and scratch buffers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

namespace gradwire {

// Cache-line (and AVX-512) alignment: vector loads never straddle lines, and two
// buffers never share a line, so ranks writing neighbouring buffers don't false-share.
inline constexpr std::size_t buffer_alignment = 64;

template <class T>
class aligned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "aligned_buffer holds trivially copyable elements only");

 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t count) : data_(allocate(count)), size_(count) {
    // Zeroing also pre-faults the pages: first touch is slow on these machines and
    // must not land on a hot path.
    if (count) std::memset(static_cast<void*>(data_.get()), 0, count * sizeof(T));
  }
  aligned_buffer(const aligned_buffer& other) : aligned_buffer(other.size_) {
    if (size_) std::memcpy(static_cast<void*>(data_.get()), other.data_.get(), size_ * sizeof(T));
  }
  aligned_buffer& operator=(const aligned_buffer& other) {
    if (this != &other) *this = aligned_buffer(other);
    return *this;
  }
  // A moved-from buffer is empty (null data, size 0), never {null, n}.
  aligned_buffer(aligned_buffer&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::span<T> span() noexcept { return {data(), size_}; }
  std::span<const T> span() const noexcept { return {data(), size_}; }

  // Grow-only: keeps the allocation when it is already large enough, so a buffer
  // reused across calls allocates (and faults pages) once. Contents are not kept.
  void reserve_discard(std::size_t count) {
    if (count > size_) *this = aligned_buffer(std::max(count, size_ + size_ / 2));
  }

 private:
  struct deleter {
    void operator()(T* p) const noexcept { ::operator delete(p, std::align_val_t{buffer_alignment}); }
  };
  static T* allocate(std::size_t count) {
    if (count == 0) return nullptr;
    return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t{buffer_alignment}));
  }

  std::unique_ptr<T, deleter> data_;
  std::size_t size_ = 0;
};

}  // namespace gradwire
