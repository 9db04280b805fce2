// Deadlines and the default timeouts of every blocking call, documented in one place.
#pragma once

#include <chrono>

namespace gradwire {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

// Default for every blocking collective / transport call: long enough for a slow
// step on an oversubscribed machine, short enough that a lost peer is noticed.
inline constexpr std::chrono::milliseconds default_timeout{std::chrono::minutes(5)};

inline deadline deadline_after(std::chrono::milliseconds timeout) { return clock::now() + timeout; }

}  // namespace gradwire
