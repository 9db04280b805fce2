// The transport of a job with one rank: nothing to talk to, used by one_device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "traffic.hpp"

namespace gradwire::transport {

class local {
 public:
  struct request {};

  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }

  // A job of one rank has no peers; collectives never call these.
  request async_send(int peer, std::uint64_t, std::span<const std::byte>) { no_peer(peer); }
  request async_recv(int peer, std::uint64_t, std::span<std::byte>) { no_peer(peer); }
  void wait(request&, deadline) {}
  // Nothing ever moves (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return {}; }

 private:
  [[noreturn]] static void no_peer(int peer) {
    throw error(errc::invalid_argument,
                "transport::local has a single rank; there is no rank " + std::to_string(peer) + " to talk to");
  }
};

static_assert(concepts::transport<local> && concepts::metered_transport<local>);

}  // namespace gradwire::transport
