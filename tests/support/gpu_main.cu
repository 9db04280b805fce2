// Catch2's main for GPU test executables: without a CUDA device they exit 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <gradwire/cuda/runtime.cuh>

#include <cstdio>

int main(int argc, char** argv) {
  if (gradwire::cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "%s: no CUDA device (or no driver) here: these GPU tests did not run. ctest reports them as skipped; "
                 "run them on a machine with a GPU (ctest -L gpu).\n",
                 argc > 0 ? argv[0] : "gpu test");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
