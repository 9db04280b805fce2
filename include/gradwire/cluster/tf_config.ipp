// TF_CONFIG parsing's definitions (tf_config.hpp), over nlohmann-json. Compiled once in src/asio.cpp, or
// included by tf_config.hpp in header-only mode (config.hpp).
#pragma once

#include <gradwire/cluster/tf_config.hpp>
#include <gradwire/error.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::cluster {

namespace detail {

[[noreturn]] inline void tf_config_error(const std::string& problem) {
  bool sentence = problem.starts_with("is ") || problem.starts_with("has ");  // "TF_CONFIG is not valid JSON"
  throw error(errc::config, (sentence ? "TF_CONFIG " : "TF_CONFIG: ") + problem +
                                R"( (expected {"cluster": {"chief": ["host:port"], "worker": [...], "ps": [...]}, )"
                                R"("task": {"type": "worker", "index": 0}}))");
}



// "host:port" or "[v6]:port".
GRADWIRE_DECL std::optional<host_port> split_host_port(std::string_view address) {
  std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) return std::nullopt;
  std::string_view host = address.substr(0, colon), port_text = address.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return std::nullopt;  // a bare IPv6 address needs brackets to tell its port apart
  }
  int port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port < 1 || port > 65535) return std::nullopt;
  return host_port{std::string(host), port};
}

}  // namespace detail

GRADWIRE_DECL tf_config parse_tf_config(std::string_view text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number too large
    detail::tf_config_error(std::string("is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) detail::tf_config_error("is not a JSON object");
  auto cluster_it = doc.find("cluster");
  if (cluster_it == doc.end() || !cluster_it->is_object())
    detail::tf_config_error("has no \"cluster\" object");
  auto task_it = doc.find("task");
  if (task_it == doc.end() || !task_it->is_object()) detail::tf_config_error("has no \"task\" object");

  tf_config out;
  constexpr task_type order[] = {task_type::chief, task_type::worker, task_type::ps};
  for (const auto& [key, value] : cluster_it->items()) {
    if (key != "chief" && key != "worker" && key != "ps")
      detail::tf_config_error("unknown task type \"" + key + "\" in \"cluster\" (gradwire knows chief, worker, ps)");
    if (!value.is_array()) detail::tf_config_error("cluster." + key + " is not a list of \"host:port\" strings");
  }
  std::vector<detail::host_port> hosts;
  int first_rank[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  for (int t = 0; t < 3; ++t) {
    first_rank[t] = static_cast<int>(out.roles.size());
    auto list = cluster_it->find(name_of(order[t]));
    if (list == cluster_it->end()) continue;
    for (const auto& entry : *list) {
      std::string where = std::string("cluster.") + name_of(order[t]) + "[" + std::to_string(count[t]) + "]";
      if (!entry.is_string()) detail::tf_config_error(where + " is not a \"host:port\" string");
      auto address = entry.get<std::string>();
      auto parsed = detail::split_host_port(address);
      if (!parsed) detail::tf_config_error(where + " = \"" + address + "\" is not \"host:port\" with a port in 1..65535");
      out.roles.push_back(order[t]);
      out.task_addresses.push_back(address);
      hosts.push_back(*parsed);
      ++count[t];
    }
  }
  if (count[0] > 1) detail::tf_config_error("cluster.chief has " + std::to_string(count[0]) + " entries; at most one chief");
  if (count[0] + count[1] == 0) detail::tf_config_error("cluster has no chief and no worker");

  auto type_it = task_it->find("type");
  if (type_it == task_it->end() || !type_it->is_string()) detail::tf_config_error("task.type is missing or not a string");
  auto type = type_it->get<std::string>();
  int t = type == "chief" ? 0 : type == "worker" ? 1 : type == "ps" ? 2 : -1;
  if (t < 0) detail::tf_config_error("unknown task.type \"" + type + "\" (gradwire knows chief, worker, ps)");
  auto index_it = task_it->find("index");
  int index = 0;
  if (index_it != task_it->end()) {
    if (!index_it->is_number_integer()) detail::tf_config_error("task.index is not an integer");
    auto wide = index_it->get<long long>();
    if (wide < 0 || wide >= count[t])
      detail::tf_config_error("task.index " + std::to_string(wide) + " is out of range: cluster." + type + " has " +
                              std::to_string(count[t]) + " entries");
    index = static_cast<int>(wide);
  } else if (count[t] == 0) {
    detail::tf_config_error("task.type is \"" + type + "\" but cluster." + type + " is empty");
  }
  out.rank = first_rank[t] + index;

  // The chief runs the rendezvous store; without one, worker 0 (rank 0 either way).
  out.master_host = hosts[0].host;
  out.master_port = hosts[0].port;
  const std::string& my_host = hosts[static_cast<std::size_t>(out.rank)].host;
  out.local_world_size = 0;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    if (hosts[r].host != my_host) continue;
    if (static_cast<int>(r) < out.rank) ++out.local_rank;
    ++out.local_world_size;
  }
  return out;
}

}  // namespace gradwire::cluster
