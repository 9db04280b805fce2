// Catch2's main for GPU test executables: without a CUDA device they exit 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <gradwire/cuda/runtime.cuh>

#include <cstdio>

// Runs first in every GPU test binary: the device the tests use takes stream-ordered
// memory and returns what was written to it, so a broken driver or device shows here,
// not as a puzzling kernel failure.
TEST_CASE("the CUDA device works: stream-ordered memory round-trips through it", "[cuda][runtime]") {
  REQUIRE(gradwire::cuda::device_count() > 0);
  gradwire::cuda::stream stream;
  gradwire::cuda::device_buffer<unsigned char> buffer(stream);
  buffer.reserve_discard(1000);
  REQUIRE(buffer.size() == 1000);
  gradwire::cuda::check(cudaMemsetAsync(buffer.data(), 0x5a, 1000, stream), "cudaMemsetAsync");
  unsigned char back[1000] = {};
  gradwire::cuda::check(cudaMemcpyAsync(back, buffer.data(), sizeof back, cudaMemcpyDeviceToHost, stream), "copy");
  stream.synchronize();
  for (unsigned char b : back) REQUIRE(b == 0x5a);
  REQUIRE_THROWS_AS(gradwire::cuda::check(cudaErrorInvalidValue, "a failed call"), gradwire::error);
}

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
