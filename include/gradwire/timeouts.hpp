// Deadlines and the default timeouts of every blocking call, documented in one place.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "clock.hpp"
#include "error.hpp"

namespace gradwire {

// Default for every blocking collective / transport call: long enough for a slow
// step on an oversubscribed machine, short enough that a lost peer is noticed.
inline constexpr std::chrono::milliseconds default_timeout{std::chrono::minutes(5)};

// A link is probed by TCP keepalive every heartbeat interval while it is idle (the
// kernel answers for a peer even while the peer's process is stopped), and a peer whose
// host answered nothing, neither probes nor data, for heartbeat_misses intervals is lost:
// a partition or a dead host, detected within about (misses + 1.5) intervals, 6.5 s by
// default, instead of at the operation deadline. GRADWIRE_HEARTBEAT=SECONDS (0: off).
inline constexpr std::chrono::seconds default_heartbeat_interval{1};
inline constexpr int default_heartbeat_misses = 5;
// A rank that has waited this long for a peer logs (once) which rank it waits for, in
// which collective, and which rank the chain of waits ends at (GRADWIRE_STALL_WARN).
inline constexpr std::chrono::milliseconds default_stall_warn{std::chrono::seconds(60)};
// Waiting ranks fail with timeout after this long, naming the stalled rank
// (GRADWIRE_STALL_TIMEOUT); 0: never before the operation deadline (default_timeout).
inline constexpr std::chrono::milliseconds default_stall_timeout{0};

// An operation withdrawn while its frame is half through the connection (a collective that
// every rank of an elastic view abandons at once when a member is lost) is let finish for
// up to this long, so that the link stays in step; past it the connection is closed.
inline constexpr std::chrono::milliseconds withdraw_grace{std::chrono::seconds(2)};

// Waits for what a live peer sends at once (a parameter-server worker's end-of-job done
// leaving for its servers and standbys, an elastic replacement's welcome from each rank):
// a stopped or partitioned peer costs this much, not default_timeout.
inline constexpr std::chrono::milliseconds prompt_reply_timeout{std::chrono::seconds(10)};

// Seconds as an environment variable `name` gives them ("30", "0.5"): errc::config
// naming the variable if `text` is not a number from 0.001 to 1e7.
inline std::chrono::milliseconds parse_seconds(const char* name, const std::string& text) {
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(seconds >= 0.001) || seconds > 1e7)
    throw error(errc::config, std::string(name) + "='" + text + "' is not a number of seconds from 0.001 to 1e7");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// The per-operation deadline of collectives when communicator_options leave it at
// default_timeout: GRADWIRE_STEP_TIMEOUT=SECONDS if set, read once per process.
inline std::chrono::milliseconds step_timeout() {
  static const std::chrono::milliseconds timeout = [] {
    const char* text = std::getenv("GRADWIRE_STEP_TIMEOUT");
    return text && *text ? parse_seconds("GRADWIRE_STEP_TIMEOUT", text) : default_timeout;
  }();
  return timeout;
}

}  // namespace gradwire
