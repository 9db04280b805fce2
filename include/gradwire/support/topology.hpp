// Which ranks share a host: host index, local rank and local size of every rank of a job.
//
// Hosts are numbered in order of first appearance by rank (rank 0 is on host 0), so
// every rank that sees the same per-rank host identities builds the same numbering.
// Collectives read it from the communicator (hierarchical all-reduce), transports that
// learn it at join expose it (concepts::topology_aware_transport).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"

namespace gradwire::support {

class topology {
 public:
  // One rank on one host.
  topology() : topology(std::vector<int>{0}) {}

  // From a host label per rank: ranks with equal labels share a host. Labels are
  // renumbered by first appearance (so {5, 3, 5} becomes hosts {0, 1, 0}). `names`, if
  // given, holds one display name per renumbered host.
  GRADWIRE_DECL explicit topology(std::vector<int> host_labels, std::vector<std::string> names = {});

  // From the host identity each rank published (rank order) and, optionally, a display
  // name per rank (a host is shown by the name its lowest rank gave).
  GRADWIRE_DECL static topology from_identities(std::span<const std::string> identities,
                                  std::span<const std::string> display_names = {});

  // `ranks` ranks on one host: what a transport that knows no better reports.
  static topology one_host(int ranks, std::string name = "localhost") {
    if (ranks < 1) throw error(errc::invalid_argument, "topology::one_host: ranks must be >= 1");
    topology t(std::vector<int>(static_cast<std::size_t>(ranks), 0));
    t.names_[0] = std::move(name);
    return t;
  }

  int size() const noexcept { return static_cast<int>(host_of_.size()); }
  int host_count() const noexcept { return static_cast<int>(ranks_on_.size()); }
  int host(int rank) const { return host_of_.at(checked(rank)); }
  // The ranks on `host`, ascending.
  std::span<const int> ranks_on(int host) const { return ranks_on_.at(static_cast<std::size_t>(host)); }
  // Position of `rank` among the ranks of its host, and how many ranks that host has.
  int local_rank(int rank) const { return local_rank_.at(checked(rank)); }
  int local_size(int rank) const { return static_cast<int>(ranks_on(host(rank)).size()); }
  const std::string& host_name(int host) const { return names_.at(static_cast<std::size_t>(host)); }
  // The most ranks any host has.
  int max_local_size() const noexcept {
    std::size_t most = 0;
    for (const auto& r : ranks_on_) most = std::max(most, r.size());
    return static_cast<int>(most);
  }

  // Ranks span two or more hosts and some host has two or more: a hierarchy to exploit
  // (one host, or one rank per host, is a flat ring's case). The static form takes the
  // counts, for a layout known only by them (the cost models' cluster_model).
  bool spans_hosts_with_shared_host() const noexcept { return spans_hosts_with_shared_host(host_count(), max_local_size()); }
  static constexpr bool spans_hosts_with_shared_host(int hosts, int most_ranks_on_a_host) noexcept {
    return hosts >= 2 && most_ranks_on_a_host >= 2;
  }

  // "2 hosts: 0 (a) ranks 0,2; 1 (b) ranks 1,3"
  GRADWIRE_DECL std::string to_string() const;

  friend bool operator==(const topology& a, const topology& b) {
    return a.host_of_ == b.host_of_ && a.names_ == b.names_;
  }

 private:
  GRADWIRE_DECL void build(const std::vector<std::string>& keys);

  std::size_t checked(int rank) const {
    if (rank < 0 || rank >= size())
      throw error(errc::invalid_argument, "topology: rank " + std::to_string(rank) + " outside 0.." +
                                              std::to_string(size() - 1));
    return static_cast<std::size_t>(rank);
  }

  std::vector<int> host_of_, local_rank_;
  std::vector<std::vector<int>> ranks_on_;
  std::vector<std::string> names_;
};

}  // namespace gradwire::support

namespace gradwire::cluster {
// Its users' name: the cluster layer fills it in; it lives in support/ so that concepts.hpp
// and the transports need not include cluster/.
using support::topology;
}  // namespace gradwire::cluster

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "topology.ipp"
#endif
