// Parses a TensorFlow-style TF_CONFIG (cluster + task) into roles, addresses and a rank.
#pragma once

#include <gradwire/config.hpp>
#include <gradwire/error.hpp>

#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::cluster {

enum class task_type { chief, worker, ps };

inline const char* name_of(task_type type) {
  switch (type) {
    case task_type::chief: return "chief";
    case task_type::worker: return "worker";
    case task_type::ps: return "ps";
  }
  return "unknown";
}

// What TF_CONFIG says about the whole job and about this process.
struct tf_config {
  std::vector<task_type> roles;             // rank order: chief, workers, ps
  std::vector<std::string> task_addresses;  // "host:port" per rank
  int rank = 0;
  int local_rank = 0, local_world_size = 1; // among the tasks on this task's host
  std::string master_host;                  // the chief's (or worker 0's) host
  int master_port = 0;
};

namespace detail {

struct host_port {
  std::string host;
  int port = 0;
};

// "host:port" or "[v6]:port".
GRADWIRE_DECL std::optional<host_port> split_host_port(std::string_view address);

}  // namespace detail

// TF_CONFIG's text parsed and checked; errc::config naming what is wrong.
GRADWIRE_DECL tf_config parse_tf_config(std::string_view text);

}  // namespace gradwire::cluster

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/asio.cpp (config.hpp)
#include <gradwire/cluster/tf_config.ipp>
#endif
