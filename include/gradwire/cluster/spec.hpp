// Who is who in a job: rank, world size, master and roles, from arguments or the launcher's environment.
#pragma once

#include <gradwire/cluster/tf_config.hpp>
#include <gradwire/config.hpp>
#include <gradwire/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::cluster {

struct cluster_spec {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";   // host of the rendezvous store (run by rank 0)
  int master_port = 0;                      // its port; 0 only in a one-process job that gave none
  std::string job_token;                    // shared secret of the job; empty if none was given
  std::string source = "default";           // "explicit", "torchrun", "openmpi", "slurm", "tf_config", "default"
  // Roles (TF_CONFIG; otherwise every rank is a worker, rank 0 the chief).
  std::vector<task_type> roles;             // roles[r] for every rank r (size world_size)
  std::vector<std::string> task_addresses;  // "host:port" per rank (TF_CONFIG only; empty otherwise)

  task_type type() const {
    if (rank >= 0 && static_cast<std::size_t>(rank) < roles.size()) return roles[static_cast<std::size_t>(rank)];
    return rank == 0 ? task_type::chief : task_type::worker;
  }
  int count(task_type t) const { return static_cast<int>(std::count(roles.begin(), roles.end(), t)); }
};

// Explicit arguments beat the environment, field by field.
struct overrides {
  std::optional<int> rank, world_size, local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;  // 0 means "not given"
  std::optional<std::string> job_token;
};

using env_lookup = std::function<std::optional<std::string>(const char* name)>;

inline std::optional<std::string> process_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The most processes a job may have: far above any job gradwire runs (UCX's tags carry
// at most 2^15 ranks), and low enough that a mistyped size is refused before detect
// allocates anything per rank (a role each).
inline constexpr int max_world_size = 1 << 20;

// Ports derived from a launcher's job id land here, away from the usual ephemeral range.
inline constexpr int derived_port_first = 20000;
inline constexpr int derived_port_count = 10000;

namespace detail {

GRADWIRE_DECL int port_from_job_id(std::string_view job_id);

// First host of a Slurm host list: "node[01-04,07],gpu3" -> "node01", "r[1-2]-n[5-6]" -> "r1-n5";
// "" for a malformed list (a bracket unclosed, nested or without a number first, an
// empty first host), so that a broken list is never half read into a host name.
GRADWIRE_DECL std::string first_slurm_host(std::string_view list);

// Slurm's "2(x3),1" tasks-per-node list; the entry of node `node`. nullopt for a node
// beyond the list or a malformed list (counts and repeats are at least 1).
GRADWIRE_DECL std::optional<int> slurm_tasks_on_node(std::string_view list, int node);

}  // namespace detail

// Precedence, field by field: `given`; torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE); mpirun's (OMPI_COMM_WORLD_*); srun's (SLURM_*); TF_CONFIG. MASTER_ADDR,
// MASTER_PORT and GRADWIRE_JOB_TOKEN apply under every launcher. Nothing set: one process.
// Throws gradwire::error(errc::config) naming the variable to set. See docs/launching.md.
GRADWIRE_DECL cluster_spec detect(const overrides& given = {}, const env_lookup& env_fn = process_env);

}  // namespace gradwire::cluster

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/asio.cpp (config.hpp)
#include <gradwire/cluster/spec.ipp>
#endif
