// Prints what gradwire::cluster::detect() sees, one line, for the mpirun and Slurm-across-hosts tests.
#include <gradwire/cluster/spec.hpp>

#include <cstdio>
#include <type_traits>

// The signature the transports and examples rely on: detect(overrides, env_lookup) -> cluster_spec.
static_assert(std::is_invocable_r_v<gradwire::cluster::cluster_spec, decltype(&gradwire::cluster::detect),
                                    const gradwire::cluster::overrides&, const gradwire::cluster::env_lookup&>);

int main() {
  try {
    auto spec = gradwire::cluster::detect();
    std::printf("rank=%d world=%d local_rank=%d local_size=%d master=%s:%d source=%s token=%s\n", spec.rank,
                spec.world_size, spec.local_rank, spec.local_world_size, spec.master_addr.c_str(), spec.master_port,
                spec.source.c_str(), spec.job_token.c_str());
  } catch (const gradwire::error& e) {
    std::fprintf(stderr, "print_spec: %s\n", e.what());
    return 1;
  }
}
