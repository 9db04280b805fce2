// ucx's one-sided access: windows exposed and attached (registered memory, remote keys), puts and gets.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Memory this rank lets its peers put into and get from, registered with UCX for the
// window's life. key() is what a peer passes to attach() (it holds the address, the
// size and UCX's packed remote key).
class ucx_memory_window {
 public:
  std::span<const std::byte> key() const noexcept { return key_; }

 private:
  friend class transport::ucx;
  friend struct ucx_engine;
  struct unmap {
    std::shared_ptr<ucx_engine> owner;
    void operator()(ucp_mem_h m) const noexcept;
  };
  std::unique_ptr<ucp_mem, unmap> memory_;
  std::vector<std::byte> key_;
};

// A peer's exposed memory, usable from this rank until destroyed or the peer is gone.
class ucx_remote_window {
 public:
  int peer() const noexcept { return rkey_.get_deleter().peer; }
  std::size_t size() const noexcept { return size_; }

 private:
  friend class transport::ucx;
  friend struct ucx_engine;
  struct release {
    std::shared_ptr<ucx_engine> owner;
    int peer;
    void operator()(ucp_rkey_h k) const noexcept;
  };
  // Small puts and gets go through the endpoint with error handling, large ones through
  // the bulk endpoint (as for messages); a key serves only the endpoint it was unpacked on.
  std::unique_ptr<ucp_rkey, release> rkey_, bulk_rkey_;
  std::uint64_t address_;
  std::size_t size_;
};

static_assert(concepts::sized_remote_window<ucx_remote_window>);  // a worker checks its size

}  // namespace gradwire::transport::detail
