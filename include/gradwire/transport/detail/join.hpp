// The join prologue every network transport shares: one deadline for the whole join, and the rendezvous store started.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "../../error.hpp"
#include "../../rendezvous/store.hpp"
#include "../../timeouts.hpp"

namespace gradwire::transport::detail {

// One deadline for the whole join: every store call gets what is left of it.
struct join_deadline {
  explicit join_deadline(std::chrono::milliseconds timeout) : until(clock::now() + timeout) {}
  std::chrono::milliseconds left() const {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()));
  }
  deadline until;
};

// A job of more than one rank meets through the store: it needs the store's port, and
// rank 0 serves it (unless another transport of the job already does: `serve` false).
template <class Options>
void start_rendezvous(const char* transport, const Options& o, bool serve, std::optional<rendezvous::store_server>& server) {
  if (o.store_port == 0)
    throw error(errc::config, std::string(transport) + ": a job of " + std::to_string(o.size) +
                                  " ranks needs the rendezvous store's port (MASTER_PORT)");
  if (o.rank == 0 && serve) server.emplace(o.store_host, o.store_port, o.job_token);
}

}  // namespace gradwire::transport::detail
