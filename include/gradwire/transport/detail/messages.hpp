// The error texts every transport uses for its operations, so that they read the same whichever transport failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../error.hpp"

namespace gradwire::transport::detail {

// Throws invalid_argument unless `peer` is a rank of a job of `size` (every transport's
// check when an operation is posted).
inline void check_peer(const char* transport, int rank, int peer, int size) {
  if (peer < 0 || peer >= size)
    throw error(errc::invalid_argument, std::string(transport) + ": rank " + std::to_string(rank) + " addressed rank " +
                                            std::to_string(peer) + " in a job of " + std::to_string(size));
}

// Tags are below 2^48 - 1 on every transport (UCX keeps the sender's rank in the bits above;
// 2^48 - 1 is its join's), so that code that runs over one transport runs over all.
inline constexpr std::uint64_t tag_limit = (std::uint64_t{1} << 48) - 1;

// Throws invalid_argument for a tag at or above tag_limit (every transport's check when an
// operation is posted).
inline void check_tag(const char* transport, std::uint64_t tag) {
  if (tag >= tag_limit)
    throw error(errc::invalid_argument,
                std::string(transport) + ": tag " + std::to_string(tag) + " is not below 2^48 - 1");
}

// What a rank says of a peer started with another world size (TCP's hello, UCX's address).
inline std::string world_size_mismatch_message(std::uint64_t peer, std::uint64_t peer_size, int rank, int size) {
  return "rank " + std::to_string(peer) + " was started with world size " + std::to_string(peer_size) + ", rank " +
         std::to_string(rank) + " with " + std::to_string(size) + ": give every rank the same WORLD_SIZE";
}

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

// "rank 0: rank 2 failed: REASON": a peer's abort frame or control message, as this rank reports it.
inline std::string peer_failed_message(int rank, int peer, const std::string& reason) {
  return "rank " + std::to_string(rank) + ": rank " + std::to_string(peer) + " failed: " + reason;
}

// "rank 0 failed: REASON": this rank's own failure (fail(), or an exception that unwinds).
inline std::string rank_failed_message(int rank, const std::string& reason) {
  return "rank " + std::to_string(rank) + " failed: " + reason;
}

// "ranks 2, 3 stalled (gave up after ...)": why waiting ranks gave up (a stall timeout),
// naming the ranks the chains of waits end at.
inline std::string stalled_message(const std::vector<int>& stalled, const std::string& gave_up) {
  if (stalled.empty()) return "no rank is stalled but the ranks wait for each other " + gave_up;
  std::string names;
  for (std::size_t i = 0; i < stalled.size(); ++i) names += (i ? ", " : "") + std::to_string(stalled[i]);
  return std::string(stalled.size() > 1 ? "ranks " : "rank ") + names + " stalled " + gave_up;
}

// "rank 0: receive from rank 1 (tag 7, 64 bytes) abandoned: rank 2 failed: REASON": an
// operation that a peer's failure ended before it completed.
inline std::string abandoned_by_message(int rank, const std::string& operation, int peer, const std::string& reason) {
  return "rank " + std::to_string(rank) + ": " + operation + " abandoned: rank " + std::to_string(peer) +
         " failed: " + reason;
}

// "rank 0: lost rank 2: WHY": a peer lost without a word from it (its connection or
// endpoint broke, it died); WHY says how this rank noticed.
inline std::string lost_peer_message(int rank, int peer, const std::string& why) {
  return "rank " + std::to_string(rank) + ": lost rank " + std::to_string(peer) + ": " + why;
}

// "rank 0: lost rank 2: it failed: REASON": a failed peer, whose loss is tolerated.
inline std::string tolerated_peer_failed_message(int rank, int peer, const std::string& reason) {
  return lost_peer_message(rank, peer, "it failed: " + reason);
}

// "rank 0: lost rank 2: rank 1 reports: WHY": a lost peer, as rank 1 told this rank (it
// failed from that loss before this rank noticed it).
inline std::string relayed_by(int peer, const std::string& why) {
  return "rank " + std::to_string(peer) + " reports: " + why;
}
inline std::string relayed_loss_message(int rank, int lost, int peer, const std::string& why) {
  return lost_peer_message(rank, lost, relayed_by(peer, why));
}

// "rank 0: rank 2 has finished (said goodbye) and will send nothing more": a peer that left
// in good order; operations that still needed it fail with peer_lost.
inline std::string finished_message(int rank, int peer, const std::string& how = "said goodbye") {
  return "rank " + std::to_string(rank) + ": rank " + std::to_string(peer) + " has finished (" + how +
         ") and will send nothing more";
}

// Why an operation withdrawn while its bytes were on the wire fails the rank.
inline std::string abandoned_message(int peer) {
  return "an operation with rank " + std::to_string(peer) + " was abandoned mid-message (timeout or error)";
}

// The same, for a tolerated peer: it is cut off (lost), and the rank goes on.
inline std::string abandoned_peer_message(int rank, int peer) {
  return lost_peer_message(rank, peer, "an operation with it was abandoned mid-message (timeout or error)");
}

}  // namespace gradwire::transport::detail
