// What every GPU test executable links beside Catch2's prebuilt main (Catch2::Catch2WithMain):
// - without a CUDA device, the run exits 77 before the first test, which ctest reports as
//   skipped (SKIP_RETURN_CODE), never as passed; --list-tests still works;
// - the first test checks the device itself.
// A listener, not a main of our own: a main needs Catch2's implementation compiled with it,
// 64 s through nvcc (40 s through g++) in every build, against 9 s for this file.
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // Catch::TestEventListenerBase
#include <catch2/catch.hpp>

#include <gradwire/cuda/runtime.cuh>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct skip_without_a_device : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(Catch::TestRunInfo const& run) override {
    if (gradwire::cuda::device_count() > 0) return;
    std::fprintf(stderr,
                 "%s: no CUDA device (or no driver) here: these GPU tests did not run. ctest reports them as skipped; "
                 "run them on a machine with a GPU (ctest -L gpu).\n",
                 std::string(run.name).c_str());
    std::exit(77);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(skip_without_a_device)

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
