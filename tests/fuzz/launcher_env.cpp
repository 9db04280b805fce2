// Fuzzes the environment a launcher hands a rank: cluster::detect (torchrun, OpenMPI,
// Slurm, TF_CONFIG, MASTER_*, GRADWIRE_NUM_PS; Slurm's task and node lists), the TCP
// transport's GRADWIRE_* knobs (cluster::tcp_options: seconds, integers, flags) and
// GRADWIRE_STEP_TIMEOUT (parse_seconds).
//
// Input: [overrides][entries]. overrides bits 0..3: an explicit rank, world size, local
// rank, master port follows (i32 each, in that order). Each entry is [variable][value]
// up to a NUL byte (environment values hold none); the variable is an index into the
// table below. A later entry of a variable replaces an earlier one.
// Properties: only errc::config rejects, and its message names a variable (the one to
// fix or to set) or an override; a spec that is accepted is consistent (ranks in range, one role per
// rank, a port for a job of several processes).
#include <gradwire/cluster/spec.hpp>
#include <gradwire/cluster/tcp.hpp>
#include <gradwire/timeouts.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <string>

#include "fuzz_support.hpp"

namespace gc = gradwire::cluster;
using gradwire::errc;

namespace {

constexpr const char* variables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_precondition_transports",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_JOB_TOKEN", "GRADWIRE_NUM_PS",
    "GRADWIRE_TIMEOUT", "GRADWIRE_LISTEN_HOST", "GRADWIRE_WIRE_CHECKSUM", "GRADWIRE_HOST_ID",
    "GRADWIRE_SOCKET_BUFFER", "GRADWIRE_POLL_US", "GRADWIRE_HEARTBEAT", "GRADWIRE_STALL_WARN",
    "GRADWIRE_STALL_TIMEOUT", "GRADWIRE_STEP_TIMEOUT",
};
constexpr std::size_t variable_count = sizeof variables / sizeof variables[0];

void check_spec(const gc::cluster_spec& s) {
  GRADWIRE_FUZZ_CHECK(s.world_size >= 1 && s.rank >= 0 && s.rank < s.world_size, "detect accepted a rank outside the world");
  GRADWIRE_FUZZ_CHECK(s.local_world_size >= 1 && s.local_world_size <= s.world_size && s.local_rank >= 0 &&
                          s.local_rank < s.local_world_size,
                      "detect accepted a local rank or size out of range");
  GRADWIRE_FUZZ_CHECK(s.roles.size() == static_cast<std::size_t>(s.world_size), "detect gave a role count != world size");
  GRADWIRE_FUZZ_CHECK(s.task_addresses.empty() || s.task_addresses.size() == s.roles.size(),
                      "detect gave task addresses for some ranks only");
  GRADWIRE_FUZZ_CHECK(s.master_port >= 0 && s.master_port <= 65535 && (s.world_size == 1 || s.master_port != 0),
                      "detect accepted a job without a usable rendezvous port");
  GRADWIRE_FUZZ_CHECK(!s.master_addr.empty(), "detect accepted an empty master address");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t which = in.byte();
  gc::overrides given;
  if (which & 1) given.rank = in.integer<std::int32_t>();
  if (which & 2) given.world_size = in.integer<std::int32_t>();
  if (which & 4) given.local_rank = in.integer<std::int32_t>();
  if (which & 8) given.master_port = in.integer<std::int32_t>();
  std::map<std::string, std::string> env;
  while (!in.empty()) {
    const char* name = variables[in.byte() % variable_count];
    env[name] = in.until('\0');
  }
  const gc::env_lookup lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  // A rejection names what to fix: a variable (the wrong one, or the one missing), or an override.
  auto names_a_setting = [&](const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::config});
    const std::string_view what = e.what();
    if (what.find("overrides") != std::string_view::npos) return;
    const bool names_a_variable = std::any_of(std::begin(variables), std::end(variables), [&](const char* name) {
      return what.find(name) != std::string_view::npos;
    });
    GRADWIRE_FUZZ_CHECK(names_a_variable, std::string("a configuration error that names no variable: ") + e.what());
  };
  try {
    const gc::cluster_spec spec = gc::detect(given, lookup);
    check_spec(spec);
    const auto o = gc::tcp_options(spec, lookup);
    GRADWIRE_FUZZ_CHECK(o.socket_buffer_bytes >= 0 && o.poll_before_sleep.count() >= 0 && o.heartbeat_interval.count() >= 0,
                        "tcp_options accepted a negative setting");
  } catch (const gradwire::error& e) {
    names_a_setting(e);
  }
  if (auto it = env.find("GRADWIRE_STEP_TIMEOUT"); it != env.end()) {
    try {
      const auto t = gradwire::parse_seconds("GRADWIRE_STEP_TIMEOUT", it->second);
      GRADWIRE_FUZZ_CHECK(t.count() >= 1 && t.count() <= 10'000'000'000LL, "parse_seconds out of its range");
    } catch (const gradwire::error& e) {
      gradwire::fuzz::expect_error(e, {errc::config}, "GRADWIRE_STEP_TIMEOUT");
    }
  }
  return 0;
}
