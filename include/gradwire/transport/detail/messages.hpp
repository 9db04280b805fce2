// The error texts every transport uses for its operations, so that they read the same whichever transport failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradwire::transport::detail {

// "send to rank 2 (tag 65536, 4096 bytes)"
inline std::string describe_operation(bool is_send, int peer, std::uint64_t tag, std::size_t bytes) {
  return std::string(is_send ? "send to rank " : "receive from rank ") + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
}

inline std::string timeout_message(int rank, const std::string& operation) {
  return "rank " + std::to_string(rank) + ": " + operation +
         " did not complete before its deadline (is a rank missing or behind?)";
}

inline std::string wait_any_timeout_message(int rank, std::size_t requests) {
  return timeout_message(rank, "none of " + std::to_string(requests) + " awaited operations");
}

inline std::string size_mismatch_message(int sender, std::uint64_t sent, std::uint64_t tag, int receiver,
                                         std::uint64_t expected) {
  return "message size mismatch: rank " + std::to_string(sender) + " sent " + std::to_string(sent) + " bytes (tag " +
         std::to_string(tag) + ") but rank " + std::to_string(receiver) + " expected " + std::to_string(expected);
}

}  // namespace gradwire::transport::detail
