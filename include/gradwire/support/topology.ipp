// Definitions of topology.hpp: compiled once in src/core.cpp, or included by topology.hpp in header-only
// mode (config.hpp).
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "topology.hpp"

namespace gradwire::support {

GRADWIRE_DECL topology::topology(std::vector<int> host_labels, std::vector<std::string> names) {
  if (host_labels.empty()) throw error(errc::invalid_argument, "topology: a job has at least one rank");
  std::vector<std::string> keys;
  for (int label : host_labels) keys.push_back(std::to_string(label));
  build(keys);
  if (!names.empty()) {
    if (names.size() != ranks_on_.size())
      throw error(errc::invalid_argument, "topology: " + std::to_string(names.size()) + " host names for " +
                                              std::to_string(ranks_on_.size()) + " hosts");
    names_ = std::move(names);
  }
}

GRADWIRE_DECL topology topology::from_identities(std::span<const std::string> identities,
                                std::span<const std::string> display_names) {
  if (identities.empty()) throw error(errc::invalid_argument, "topology: a job has at least one rank");
  if (!display_names.empty() && display_names.size() != identities.size())
    throw error(errc::invalid_argument, "topology: " + std::to_string(display_names.size()) +
                                            " display names for " + std::to_string(identities.size()) + " ranks");
  topology t;
  t.build(std::vector<std::string>(identities.begin(), identities.end()));
  if (!display_names.empty())
    for (std::size_t h = 0; h < t.ranks_on_.size(); ++h) t.names_[h] = display_names[t.ranks_on_[h].front()];
  return t;
}

GRADWIRE_DECL std::string topology::to_string() const {
  // Appended piece by piece (GCC 12 warns falsely about `"literal" + std::string`).
  std::string s = std::to_string(host_count());
  s += host_count() == 1 ? " host:" : " hosts:";
  for (int h = 0; h < host_count(); ++h) {
    s += h ? "; " : " ";
    s += std::to_string(h);
    s += " (";
    s += names_[static_cast<std::size_t>(h)];
    s += ") ranks ";
    bool first = true;
    for (int r : ranks_on(h)) {
      if (!first) s += ',';
      s += std::to_string(r);
      first = false;
    }
  }
  return s;
}

GRADWIRE_DECL void topology::build(const std::vector<std::string>& keys) {
  std::unordered_map<std::string, int> index;
  host_of_.assign(keys.size(), 0);
  local_rank_.assign(keys.size(), 0);
  ranks_on_.clear();
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const auto [it, fresh] = index.try_emplace(keys[r], static_cast<int>(ranks_on_.size()));
    if (fresh) ranks_on_.emplace_back();
    host_of_[r] = it->second;
    local_rank_[r] = static_cast<int>(ranks_on_[static_cast<std::size_t>(it->second)].size());
    ranks_on_[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(r));
  }
  names_.clear();
  for (std::size_t h = 0; h < ranks_on_.size(); ++h) names_.push_back("host" + std::to_string(h));
}

}  // namespace gradwire::support
