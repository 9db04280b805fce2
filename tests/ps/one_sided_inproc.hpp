// Test transport: inproc with one-sided access (concepts::one_sided_transport), so that a parameter server's
// window path (ps/windows.hpp) runs on threads: the ranks share one address space, a window's key is its
// address and size, and a put or a get is a memcpy done when it is started (its request is already complete).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gradwire/transport/inproc.hpp>
#include <span>
#include <stdexcept>
#include <string>

namespace gradwire::test {

class one_sided_inproc {
 public:
  using request = transport::inproc::request;

  class memory_window {
   public:
    explicit memory_window(std::span<std::byte> memory) {
      const std::uint64_t at = reinterpret_cast<std::uintptr_t>(memory.data()), size = memory.size();
      std::memcpy(key_, &at, sizeof at);
      std::memcpy(key_ + sizeof at, &size, sizeof size);
    }
    std::span<const std::byte> key() const noexcept { return key_; }

   private:
    std::byte key_[16];
  };
  class remote_window {
   public:
    remote_window(std::byte* base, std::size_t size) : base_(base), size_(size) {}
    std::size_t size() const noexcept { return size_; }
    // Refuses an access past the end (the server's window is smaller than the worker thinks).
    std::byte* at(std::size_t offset, std::size_t bytes) const {
      if (offset + bytes > size_)
        throw std::out_of_range("one_sided_inproc: an access of " + std::to_string(bytes) + " bytes at " +
                                std::to_string(offset) + " in a window of " + std::to_string(size_));
      return base_ + offset;
    }

   private:
    std::byte* base_;
    std::size_t size_;
  };

  explicit one_sided_inproc(transport::inproc t) : t_(std::move(t)) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    return t_.async_send(peer, tag, bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) { return t_.async_recv(peer, tag, bytes); }
  // A put's or get's request is empty: it completed when it was started.
  void wait(request& r, deadline until) {
    if (r) t_.wait(r, until);
  }
  std::size_t wait_any(std::span<request* const> requests, deadline until) { return t_.wait_any(requests, until); }

  memory_window expose(std::span<std::byte> memory) {
    ++exposed_;
    return memory_window(memory);
  }
  remote_window attach(int, std::span<const std::byte> key) {
    std::uint64_t at = 0, size = 0;
    if (key.size() != 16) throw std::invalid_argument("one_sided_inproc: a key of " + std::to_string(key.size()) + " bytes");
    std::memcpy(&at, key.data(), sizeof at);
    std::memcpy(&size, key.data() + sizeof at, sizeof size);
    return remote_window(reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(at)), size);
  }
  request async_put(remote_window& to, std::size_t offset, std::span<const std::byte> bytes) {
    if (!bytes.empty()) std::memcpy(to.at(offset, bytes.size()), bytes.data(), bytes.size());
    put_bytes_ += bytes.size();
    return {};
  }
  request async_get(remote_window& from, std::size_t offset, std::span<std::byte> bytes) {
    if (!bytes.empty()) std::memcpy(bytes.data(), from.at(offset, bytes.size()), bytes.size());
    return {};
  }
  bool prefers_one_sided(int) const noexcept { return true; }

  // What this rank did one-sided: windows exposed, bytes put.
  int exposed() const noexcept { return exposed_; }
  std::size_t put_bytes() const noexcept { return put_bytes_; }

 private:
  transport::inproc t_;
  int exposed_ = 0;
  std::size_t put_bytes_ = 0;
};
static_assert(concepts::multiplexing_transport<one_sided_inproc> && concepts::one_sided_transport<one_sided_inproc> &&
              concepts::sized_remote_window<one_sided_inproc::remote_window>);

}  // namespace gradwire::test
