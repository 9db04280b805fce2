// Prints what gradwire::cluster::detect() sees, one line, for the mpirun test.
#include <gradwire/cluster/spec.hpp>

#include <cstdio>

int main() {
  try {
    auto spec = gradwire::cluster::detect();
    std::printf("rank=%d world=%d local_rank=%d master=%s:%d source=%s token=%s\n", spec.rank, spec.world_size,
                spec.local_rank, spec.master_addr.c_str(), spec.master_port, spec.source.c_str(), spec.job_token.c_str());
  } catch (const gradwire::error& e) {
    std::fprintf(stderr, "print_spec: %s\n", e.what());
    return 1;
  }
}
