// ucx's watch: stall warnings and the stall timeout (without asio_tcp's chain of waits: UCX ranks send no status).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../../observe/activity.hpp"
#include "../../observe/log.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

namespace ucx_stall {
inline constexpr const char* alive =
    ": it is alive as far as UCX can tell but has not answered (stopped, hung, in a long computation, or waiting for "
    "another rank: look at its own warning)";
}  // namespace ucx_stall

// "rank 0: waited 60.0 s in all_reduce (operation #12, step 40) for rank 1"
GRADWIRE_DECL std::string ucx_engine::stall_text(clock::duration waited, int peer) const {
  const observe::activity& doing = observe::current_activity();
  char text[256];
  std::snprintf(text, sizeof text, "rank %d: waited %.1f s in %s (operation #%llu, step %llu) for %s%s", options.rank,
                std::chrono::duration<double>(waited).count(), doing.name ? doing.name : "a transport wait",
                static_cast<unsigned long long>(doing.operation),
                static_cast<unsigned long long>(observe::current_step().load(std::memory_order_relaxed)),
                peer >= 0 ? "rank " : "its peers", peer >= 0 ? std::to_string(peer).c_str() : "");
  return text;
}

GRADWIRE_DECL void ucx_engine::warn_stall(clock::duration waited, int peer) const {
  observe::log_warning(options.rank, options.size, stall_text(waited, peer).c_str(), ucx_stall::alive);
}

// The stall timeout: this rank fails with timeout naming the rank it waited for (over UCX,
// without the chain of waits behind it), and tells its peers why.
GRADWIRE_DECL void ucx_engine::give_up_stall(clock::duration waited, int peer) {
  const std::string who = peer >= 0 ? stalled_message({peer}, stall.gave_up_text())
                                    : "the peers it waits for stalled " + stall.gave_up_text();
  const std::string why = who + ": " + stall_text(waited, peer) + ucx_stall::alive;
  abort_with(errc::timeout, why, -1, why);
}

}  // namespace gradwire::transport::detail
