// Payload bytes and messages a transport has moved for its rank: what per-step stats report.
//
// Below the transports so that concepts.hpp and observe/ name it without including one;
// transports and their users may spell it transport::traffic_counters.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradwire::support {

// Counted when an operation starts (a receive's size must match its send, so posted
// receives are the bytes that will arrive). One-sided puts count as sent, gets as received.
// Touched only by the rank's own thread.
struct traffic_counters {
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t messages_sent = 0, messages_received = 0;

  void sent(std::size_t bytes) noexcept {
    bytes_sent += bytes;
    ++messages_sent;
  }
  void received(std::size_t bytes) noexcept {
    bytes_received += bytes;
    ++messages_received;
  }
  // What moved between two readings (`*this` the later one).
  traffic_counters operator-(const traffic_counters& earlier) const noexcept {
    return {bytes_sent - earlier.bytes_sent, bytes_received - earlier.bytes_received,
            messages_sent - earlier.messages_sent, messages_received - earlier.messages_received};
  }
  traffic_counters& operator+=(const traffic_counters& more) noexcept {
    bytes_sent += more.bytes_sent;
    bytes_received += more.bytes_received;
    messages_sent += more.messages_sent;
    messages_received += more.messages_received;
    return *this;
  }
  bool operator==(const traffic_counters&) const = default;
};

}  // namespace gradwire::support
