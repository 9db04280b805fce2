// docs/launching.md's code: who is who, from the environment and explicit overrides.
// Run it under scripts/gradwire-run: it checks what detect() finds against what the launcher set.
#include <gradwire/cluster/spec.hpp>

#include <cstdlib>
#include <string>

#include "snippet_support.hpp"

int main() {
  const char* rank = std::getenv("RANK");
  const char* world_size = std::getenv("WORLD_SIZE");
  // [docs:detect]
  namespace gc = gradwire::cluster;
  gc::cluster_spec spec = gc::detect();            // environment only
  gc::overrides given;
  given.master_port = 29500;                       // explicit arguments beat the environment
  spec = gc::detect(given);
  // spec.rank, spec.world_size, spec.local_rank, spec.local_world_size,
  // spec.master_addr, spec.master_port, spec.job_token, spec.source, spec.roles, spec.type()
  // [/docs:detect]
  using snippets::expect;
  if (expect("launched by gradwire-run (RANK and WORLD_SIZE are set)", rank && world_size)) {
    expect("rank from RANK", spec.rank == std::atoi(rank));
    expect("world size from WORLD_SIZE", spec.world_size == std::atoi(world_size));
    expect("torchrun-style variables", spec.source == "torchrun");
  }
  expect("the explicit port beats MASTER_PORT", spec.master_port == 29500);
  expect("the job token from GRADWIRE_JOB_TOKEN",
         std::getenv("GRADWIRE_JOB_TOKEN") && spec.job_token == std::getenv("GRADWIRE_JOB_TOKEN"));
  expect("a role for every rank", spec.roles.size() == static_cast<std::size_t>(spec.world_size));
  expect("rank 0 is the chief", (spec.rank == 0) == (spec.type() == gc::task_type::chief));
  return snippets::report("snippet launching", 0);
}
