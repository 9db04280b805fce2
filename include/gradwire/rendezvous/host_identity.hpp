// Which host a rank is on: its host identity, and the exchange through a rendezvous store (any concepts::rendezvous_store) that makes a topology.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "store_text.hpp"
#include "../error.hpp"
#include "../support/topology.hpp"

namespace gradwire::rendezvous {

// This rank's host identity: GRADWIRE_HOST_ID if set (the user knows better, e.g.
// containers of one machine that should count as one host, or as several), else
// "<hostname>/<boot id>/<network namespace inode>". The boot id tells apart machines
// cloned with one hostname; the network namespace makes every namespace its own host,
// as the emulated hosts of scripts/cluster are: namespaces of one machine share its
// hostname and boot id but not its network, so their ranks reach each other only over
// the (emulated) network, and the hierarchy that pays is the one they see. Ranks of one
// namespace share loopback and memory, like the ranks of one real host.
inline std::string local_host_identity(const std::string& configured = {}) {
  if (!configured.empty()) return configured;
  if (const char* id = std::getenv("GRADWIRE_HOST_ID"); id && *id) return id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  const std::string net = ::stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : "unknown-netns";
  return std::string(name) + "/" + boot + "/" + net;
}

// Publishes this rank's host identity and display name under `prefix` + rank (one key
// per rank) and reads every rank's: the job's topology, the same on every rank. Each
// read waits until that rank has published, within `timeout` (what is left of the join).
// Store: concepts::rendezvous_store (store_client, rank 0's TCP store, or one's own).
template <concepts::rendezvous_store Store>
support::topology exchange_topology(Store& store, const std::string& prefix, int rank, int size,
                                    const std::string& identity, const std::string& display,
                                    std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      until - std::chrono::steady_clock::now()));
  };
  store.set_timeout(left());
  set_text(store, prefix + std::to_string(rank), identity + '\n' + display);
  std::vector<std::string> identities(static_cast<std::size_t>(size)), names(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    store.set_timeout(left());
    std::string value;
    try {
      value = get_text(store, prefix + std::to_string(r));
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      throw error(errc::timeout, "rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                                     " did not connect within " + std::to_string(timeout.count()) +
                                     " ms (it never published its host identity): did it start, with the same "
                                     "WORLD_SIZE and job token?");
    }
    const auto cut = value.rfind('\n');
    identities[r] = value.substr(0, cut);
    names[r] = cut == std::string::npos ? value : value.substr(cut + 1);
  }
  return support::topology::from_identities(identities, names);
}

}  // namespace gradwire::rendezvous
