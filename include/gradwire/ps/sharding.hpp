// Which server holds which elements: size-balanced pieces of the parameter tensors, the same on every rank.
//
// Tensors larger than split_elements are cut into near-equal pieces (at most one per
// server); the pieces are dealt largest first, each to the least loaded server, so the
// shards are balanced by size. A worker pushes a server's shard once every tensor it has a
// piece of is ready, so sharding also says, per tensor, which servers wait for it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "../error.hpp"

namespace gradwire::ps {

// One piece of a parameter tensor: elements [begin, end) of tensor `tensor`, owned by `server`.
struct piece {
  std::size_t tensor = 0, begin = 0, end = 0;
  int server = 0;
  std::size_t size() const noexcept { return end - begin; }
};

// Size-balanced sharding, the same on every rank: tensors of more than split_elements
// are cut into min(servers, ceil(size / split_elements)) near-equal pieces; pieces go,
// largest first, to the server holding the fewest elements. Returns the pieces in
// (tensor, begin) order.
inline std::vector<piece> partition(std::span<const std::size_t> sizes, int servers, std::size_t split_elements) {
  if (servers < 1) throw error(errc::invalid_argument, "ps::partition: servers must be >= 1");
  std::vector<piece> pieces;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const std::size_t n = sizes[t];
    std::size_t parts = 1;
    if (split_elements > 0 && n > split_elements)
      parts = std::min<std::size_t>(static_cast<std::size_t>(servers), (n + split_elements - 1) / split_elements);
    for (std::size_t k = 0; k < parts; ++k) pieces.push_back({t, n * k / parts, n * (k + 1) / parts, 0});
  }
  std::vector<std::size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pieces[a].size() > pieces[b].size();
  });
  std::vector<std::size_t> load(static_cast<std::size_t>(servers), 0);
  for (std::size_t i : order) {
    const auto s = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    pieces[i].server = static_cast<int>(s);
    load[s] += pieces[i].size();
  }
  return pieces;
}

// The partition seen from both sides: each server's pieces (its shard, in the order its
// messages and window carry them) and, per tensor, the servers holding part of it.
class sharding {
 public:
  sharding() = default;
  sharding(std::span<const std::size_t> sizes, int servers, std::size_t split_elements)
      : shards_(static_cast<std::size_t>(servers)),
        elements_(static_cast<std::size_t>(servers), 0),
        tensors_of_(static_cast<std::size_t>(servers), 0),
        servers_of_(sizes.size()) {
    for (const auto& p : partition(sizes, servers, split_elements)) {
      const auto s = static_cast<std::size_t>(p.server);
      shards_[s].push_back(p);
      elements_[s] += p.size();
      auto& holders = servers_of_[p.tensor];
      if (std::find(holders.begin(), holders.end(), p.server) == holders.end()) {
        holders.push_back(p.server);
        ++tensors_of_[s];
      }
    }
  }

  int servers() const noexcept { return static_cast<int>(shards_.size()); }
  std::size_t tensors() const noexcept { return servers_of_.size(); }
  // Server s's pieces, in (tensor, begin) order, and their total size.
  std::span<const piece> shard(int s) const noexcept { return shards_[static_cast<std::size_t>(s)]; }
  std::size_t elements(int s) const noexcept { return elements_[static_cast<std::size_t>(s)]; }
  // How many tensors server s has a piece of (its shard is complete once they are all ready).
  std::size_t tensors_of(int s) const noexcept { return tensors_of_[static_cast<std::size_t>(s)]; }
  // The servers with a piece of tensor t, each once.
  std::span<const int> servers_of(std::size_t t) const noexcept { return servers_of_[t]; }

 private:
  std::vector<std::vector<piece>> shards_;  // [server]
  std::vector<std::size_t> elements_;       // [server]
  std::vector<std::size_t> tensors_of_;     // [server]
  std::vector<std::vector<int>> servers_of_;  // [tensor]
};

}  // namespace gradwire::ps
