// Cluster detection's definitions (spec.hpp): the launchers' variables read and checked. Compiled once in
// src/asio.cpp, or included by spec.hpp in header-only mode (config.hpp).
#pragma once

#include <gradwire/cluster/spec.hpp>
#include <gradwire/support/fnv1a.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::cluster {

namespace detail {

[[noreturn]] inline void config_error(const std::string& message) { throw error(errc::config, message); }

GRADWIRE_DECL int port_from_job_id(std::string_view job_id) {
  return derived_port_first + static_cast<int>(support::fnv1a_of(job_id) % derived_port_count);
}

// First host of a Slurm host list: "node[01-04,07],gpu3" -> "node01", "r[1-2]-n[5-6]" -> "r1-n5";
// "" for a malformed list (a bracket unclosed, nested or without a number first, an
// empty first host), so that a broken list is never half read into a host name.
GRADWIRE_DECL std::string first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size();) {
    const char c = list[i];
    if (c == ',') break;
    if (c == ']') return {};
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const std::size_t close = list.find(']', i);
    if (close == std::string_view::npos) return {};
    std::string_view inside = list.substr(i + 1, close - i - 1);
    if (inside.find_first_not_of("0123456789,-") != std::string_view::npos) return {};
    inside = inside.substr(0, inside.find_first_of(",-"));
    if (inside.empty()) return {};
    host += inside;
    i = close + 1;
  }
  return host;
}

// Slurm's "2(x3),1" tasks-per-node list; the entry of node `node`. nullopt for a node
// beyond the list or a malformed list (counts and repeats are at least 1).
GRADWIRE_DECL std::optional<int> slurm_tasks_on_node(std::string_view list, int node) {
  if (node < 0) return std::nullopt;
  long long seen = 0;  // a sum of repeats: wider than one, so that it cannot overflow
  while (!list.empty()) {
    std::string_view item = list.substr(0, list.find(','));
    list.remove_prefix(std::min(list.size(), item.size() + 1));
    int tasks = 0, repeat = 1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), tasks);
    if (ec != std::errc{} || tasks < 1) return std::nullopt;
    std::string_view rest(end, static_cast<std::size_t>(item.data() + item.size() - end));
    if (!rest.empty()) {
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') return std::nullopt;
      auto [e2, ec2] = std::from_chars(rest.data() + 2, rest.data() + rest.size() - 1, repeat);
      if (ec2 != std::errc{} || e2 != rest.data() + rest.size() - 1 || repeat < 1) return std::nullopt;
    }
    if (node < seen + repeat) return tasks;
    seen += repeat;
  }
  return std::nullopt;
}

// Reads the environment; an empty variable counts as unset.
class env_reader {
 public:
  explicit env_reader(const env_lookup& env) : env_(env) {}

  std::optional<std::string> text(const char* name) const {
    auto value = env_(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }
  bool has(const char* name) const { return text(name).has_value(); }

  // `what` finishes "set NAME to ...".
  std::optional<int> integer(const char* name, const std::string& what) const {
    auto value = text(name);
    if (!value) return std::nullopt;
    std::string_view s = *value;
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    long long parsed = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), parsed);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || parsed < -2147483647ll || parsed > 2147483647ll)
      config_error(std::string(name) + "=" + *value + " is not a number: set " + name + " to " + what);
    return static_cast<int>(parsed);
  }

 private:
  const env_lookup& env_;
};

// One value with the name it was given under, for messages ("RANK=3", "overrides.rank=3").
struct setting {
  int value = 0;
  std::string name;
  std::string shown() const { return name + "=" + std::to_string(value); }
};

// The variables one launcher sets.
struct launcher_vars {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;  // nullptr: derived another way
};

inline constexpr launcher_vars torchrun_vars{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
inline constexpr launcher_vars openmpi_vars{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
inline constexpr launcher_vars slurm_vars{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

inline const char* rank_what = "this process's index (0..world size - 1)";
inline const char* world_what = "the number of processes (at least 1)";

// "0..count-1" for an error message; any int count, even INT_MIN from a hostile environment.
inline std::string index_range(int count) {
  return "0.." + std::to_string(std::max(0LL, static_cast<long long>(count) - 1));
}

inline std::optional<setting> read(const env_reader& env, const char* name, const char* what) {
  if (auto v = env.integer(name, what)) return setting{*v, name};
  return std::nullopt;
}

// srun exports the step's task count; inside an sbatch script only the allocation's.
inline const char* slurm_world_var(const env_reader& env) {
  if (env.has("SLURM_STEP_NUM_TASKS")) return "SLURM_STEP_NUM_TASKS";
  if (env.has("SLURM_NTASKS")) return "SLURM_NTASKS";
  if (env.has("SLURM_NPROCS")) return "SLURM_NPROCS";
  return "SLURM_NTASKS";
}

inline std::optional<setting> slurm_local_world(const env_reader& env) {
  int node = env.integer("SLURM_NODEID", "this node's index in the allocation").value_or(0);
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto list = env.text(name))
      if (auto tasks = slurm_tasks_on_node(*list, node)) return setting{*tasks, name};
  }
  return read(env, "SLURM_NTASKS_PER_NODE", "the number of tasks on each node");
}

// Where a launcher's job id is; mpirun and srun give every rank of one job the same one.
struct job_identity {
  std::string key;    // hashed into the port
  std::string token;  // default job token
};

inline std::optional<job_identity> openmpi_job(const env_reader& env) {
  // OpenMPI 4 exports OMPI_MCA_ess_base_jobid; OpenMPI 5 (PRRTE) names the job in PMIX_NAMESPACE.
  auto id = env.text("OMPI_MCA_ess_base_jobid");
  if (!id) id = env.text("PMIX_NAMESPACE");
  if (!id) return std::nullopt;
  std::string token = "openmpi:" + *id;
  // A random per-job value mpirun hands every rank: makes the token unguessable from the port.
  if (auto secret = env.text("OMPI_MCA_orte_precondition_transports")) token += ":" + *secret;
  return job_identity{"openmpi:" + *id, token};
}

inline std::optional<job_identity> slurm_job(const env_reader& env) {
  auto id = env.text("SLURM_JOB_ID");
  if (!id) id = env.text("SLURM_JOBID");
  if (!id) return std::nullopt;
  auto step = env.text("SLURM_STEP_ID");
  if (!step) step = env.text("SLURM_STEPID");
  std::string key = "slurm:" + *id + "." + step.value_or("batch");
  return job_identity{key, key};
}

}  // namespace detail

GRADWIRE_DECL cluster_spec detect(const overrides& given, const env_lookup& env_fn) {
  using detail::config_error;
  using detail::setting;
  const detail::env_reader env(env_fn);

  const bool torchrun = env.has("RANK") || env.has("WORLD_SIZE");
  const bool openmpi = env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE");
  const bool slurm = env.has("SLURM_PROCID");
  const auto tf_text = env.text("TF_CONFIG");

  const detail::launcher_vars* launcher = torchrun ? &detail::torchrun_vars
                                          : openmpi ? &detail::openmpi_vars
                                          : slurm   ? &detail::slurm_vars
                                                    : nullptr;
  std::optional<tf_config> tf;
  if (!launcher && tf_text) tf = parse_tf_config(*tf_text);

  cluster_spec spec;
  spec.source = given.rank ? "explicit" : launcher ? launcher->source : tf ? "tf_config" : "default";

  // torchrun inside mpirun (or the other way round) is fine while they agree.
  if (torchrun && openmpi) {
    struct pair_of_vars {
      const char *ours, *theirs, *what;
      bool overridden;
    };
    for (auto [ours, theirs, what, overridden] :
         {pair_of_vars{"RANK", "OMPI_COMM_WORLD_RANK", detail::rank_what, given.rank.has_value()},
          pair_of_vars{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", detail::world_what, given.world_size.has_value()}}) {
      if (overridden) continue;
      auto a = detail::read(env, ours, what), b = detail::read(env, theirs, what);
      if (a && b && a->value != b->value)
        config_error(a->shown() + " and " + b->shown() + " disagree: unset " + ours + " when launching with mpirun (it sets " +
                     theirs + "), or make them equal");
    }
  }

  // --- rank and world size
  std::optional<setting> rank, world;
  if (given.rank) rank = setting{*given.rank, "overrides.rank"};
  if (given.world_size) world = setting{*given.world_size, "overrides.world_size"};
  const char* rank_var = launcher ? launcher->rank : "RANK";
  const char* world_var = launcher == &detail::slurm_vars ? detail::slurm_world_var(env)
                          : launcher                      ? launcher->world_size
                                                          : "WORLD_SIZE";
  if (launcher) {
    if (!rank) rank = detail::read(env, launcher->rank, detail::rank_what);
    if (!world) world = detail::read(env, world_var, detail::world_what);
  } else if (tf) {
    if (!rank) rank = setting{tf->rank, "TF_CONFIG task"};
    if (!world) world = setting{static_cast<int>(tf->roles.size()), "TF_CONFIG cluster size"};
  }
  if (rank && !world)
    config_error(rank->shown() + " is set but " + world_var + " is not: set " + world_var + " (the number of processes)" +
                 (given.rank ? " or pass overrides.world_size" : ""));
  if (world && !rank) {
    if (world->value != 1)
      config_error(world->shown() + " is set but " + rank_var + " is not: set " + rank_var +
                   " (this process's index, " + detail::index_range(world->value) + ")");
    rank = setting{0, rank_var};
  }
  if (rank) {
    if (world->value < 1)
      config_error(world->shown() + " is not a valid world size: set " + world->name + " to the number of processes (at least 1)");
    if (world->value > max_world_size)
      config_error(world->shown() + " is more processes than gradwire supports (" + std::to_string(max_world_size) +
                   "): set " + world->name + " to the number of processes");
    if (rank->value < 0 || rank->value >= world->value)
      config_error(rank->shown() + " is out of range for " + world->shown() + ": set " + rank->name + " to " +
                   detail::index_range(world->value) + " (or " + world->name + " to the number of processes)");
    spec.rank = rank->value;
    spec.world_size = world->value;
  }
  // srun starts every task of a step and exports SLURM_STEP_ID to each; a batch script
  // itself runs as task 0 of the allocation (SLURM_PROCID=0, SLURM_NTASKS = the
  // allocation's tasks; no SLURM_STEP_ID: Slurm 22.05, checked). A program started there
  // without srun is the only process: it would wait GRADWIRE_TIMEOUT for ranks nobody starts.
  if (launcher == &detail::slurm_vars && world->name == world_var && world->value > 1 &&
      !env.has("SLURM_STEP_ID") && !env.has("SLURM_STEPID"))
    config_error(world->shown() + " is the allocation's task count, but this process was not started by srun " +
                 "(SLURM_PROCID is set, SLURM_STEP_ID is not: a batch script that runs the program itself), so no " +
                 "other task starts and it would wait GRADWIRE_TIMEOUT for " + std::to_string(world->value - 1) +
                 " ranks that never come: start the program with srun in the batch script (srun ./program ...), " +
                 "which starts all " + std::to_string(world->value) + " tasks");
  if (tf && static_cast<int>(tf->roles.size()) != spec.world_size)
    config_error(world->shown() + " contradicts TF_CONFIG, whose cluster has " + std::to_string(tf->roles.size()) +
                 " tasks: drop overrides.world_size or fix TF_CONFIG's cluster");

  // --- local rank and size. Neither given: assume one machine (local = global).
  std::optional<setting> local_rank, local_world;
  if (given.local_rank) local_rank = setting{*given.local_rank, "overrides.local_rank"};
  if (launcher) {
    if (!local_rank) local_rank = detail::read(env, launcher->local_rank, "this process's index on its machine");
    local_world = launcher->local_world_size
                      ? detail::read(env, launcher->local_world_size, "the number of processes on this machine")
                      : detail::slurm_local_world(env);
  } else if (tf) {
    if (!local_rank) local_rank = setting{tf->local_rank, "TF_CONFIG task"};
    local_world = setting{tf->local_world_size, "TF_CONFIG tasks on this host"};
  }
  if (local_world && !local_rank) {
    const char* name = launcher ? launcher->local_rank : "LOCAL_RANK";
    config_error(local_world->shown() + " is set but " + name + " is not: set " + name +
                 " (this process's index on its machine, " + detail::index_range(local_world->value) + ")");
  }
  if (!local_rank) local_rank = setting{spec.rank, "local rank"};
  if (!local_world) local_world = setting{spec.world_size, "world size"};
  if (local_world->value < 1 || local_world->value > spec.world_size)
    config_error(local_world->shown() + " is not in 1.." + std::to_string(spec.world_size) + " (the world size): set " +
                 local_world->name + " to the number of processes on this machine");
  if (local_rank->value < 0 || local_rank->value >= local_world->value)
    config_error(local_rank->shown() + " is out of range for " + local_world->shown() + ": set " + local_rank->name +
                 " to " + detail::index_range(local_world->value));
  spec.local_rank = local_rank->value;
  spec.local_world_size = local_world->value;

  // --- roles
  if (tf) {
    spec.roles = tf->roles;
    spec.task_addresses = tf->task_addresses;
  } else {
    // GRADWIRE_NUM_PS=N (gradwire-run --ps N): the last N ranks are parameter servers,
    // as in a TF_CONFIG cluster (chief, workers, ps).
    const auto ps = detail::read(env, "GRADWIRE_NUM_PS", "the number of parameter-server ranks");
    const int servers = ps ? ps->value : 0;
    if (servers < 0 || (servers > 0 && servers >= spec.world_size))
      config_error(ps->shown() + " leaves no worker in a job of " + std::to_string(spec.world_size) +
                   " ranks: use " + detail::index_range(spec.world_size));
    spec.roles.assign(static_cast<std::size_t>(spec.world_size), task_type::worker);
    std::fill(spec.roles.end() - servers, spec.roles.end(), task_type::ps);
    spec.roles[0] = task_type::chief;
  }

  // --- master address, port and token: given > MASTER_* / GRADWIRE_JOB_TOKEN > what the launcher implies
  std::optional<detail::job_identity> job;
  if (launcher == &detail::openmpi_vars) job = detail::openmpi_job(env);
  if (launcher == &detail::slurm_vars) job = detail::slurm_job(env);

  if (given.master_addr) {
    if (given.master_addr->empty()) config_error("overrides.master_addr is empty: give the host of rank 0 or leave it unset");
    spec.master_addr = *given.master_addr;
  } else if (auto addr = env.text("MASTER_ADDR")) {
    spec.master_addr = *addr;
  } else if (tf) {
    spec.master_addr = tf->master_host;
  } else if (launcher == &detail::slurm_vars) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env.text(name)) {
        spec.master_addr = detail::first_slurm_host(*list);
        if (spec.master_addr.empty())
          config_error(std::string(name) + "=" + *list + " is not a Slurm host list (such as node[01-04,07],gpu-3): " +
                       "fix it, or set MASTER_ADDR to the host of rank 0");
        break;
      }
    }
  }

  if (given.master_port && *given.master_port != 0) {
    if (*given.master_port < 0 || *given.master_port > 65535)
      config_error("overrides.master_port=" + std::to_string(*given.master_port) +
                   " is not a port: give 1..65535 (or 0 for \"not given\")");
    spec.master_port = *given.master_port;
  } else if (auto port = env.integer("MASTER_PORT", "the port of rank 0's rendezvous store (1..65535)")) {
    if (*port < 1 || *port > 65535)
      config_error("MASTER_PORT=" + std::to_string(*port) +
                   " is not a port: set MASTER_PORT to the port of rank 0's rendezvous store (1..65535)");
    spec.master_port = *port;
  } else if (tf) {
    spec.master_port = tf->master_port;
  } else if (job) {
    spec.master_port = detail::port_from_job_id(job->key);
  }
  if (spec.world_size > 1 && spec.master_port == 0) {
    std::string why = launcher == &detail::openmpi_vars ? " (mpirun exported no job id to derive one from)"
                      : launcher == &detail::slurm_vars ? " (no SLURM_JOB_ID to derive one from)"
                                                        : "";
    config_error("a job of " + std::to_string(spec.world_size) + " processes needs the rendezvous port" + why +
                 ": set MASTER_PORT (the port rank 0's store listens on, 1..65535) on every rank");
  }

  if (given.job_token) spec.job_token = *given.job_token;
  else if (auto token = env.text("GRADWIRE_JOB_TOKEN")) spec.job_token = *token;
  else if (job) spec.job_token = job->token;
  return spec;
}

}  // namespace gradwire::cluster
