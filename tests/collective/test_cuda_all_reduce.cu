// device_all_reduce against a float64 serial sum: directly between threads' device buffers (inproc)
// and staged through pinned chunks (a transport without a shared address space), 1..4 ranks on one GPU.
#include <gradwire/collective/cuda_all_reduce.cuh>
#include <gradwire/tensor/cuda_tensor.cuh>

#include <random>
#include <vector>

#include "collective/collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

template <bool Staged>
void check_device_all_reduce(int ranks, std::size_t n, reduce_op op) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, Staged, static_cast<int>(op));
  std::vector<std::vector<float>> data(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) data[static_cast<std::size_t>(r)] = gw::test::random_input<float>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, op == reduce_op::average);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::cuda::stream stream;
    gw::cuda_tensor<float> buffer(gw::shape{n}, data[static_cast<std::size_t>(t.rank())], stream);
    gw::collective::device_staging staging;
    staging.chunk_bytes = 4096;  // many chunks, odd last one: the pipeline's every branch
    auto run = [&](auto transport) {
      gw::collective::communicator comm(transport, {.timeout = 60s});
      gw::collective::device_all_reduce(comm, std::span<float>(buffer.data(), n), stream, staging, op);
      gw::collective::device_all_reduce(comm, std::span<float>(buffer.data(), 0), stream, staging, op);  // empty
    };
    if constexpr (Staged)
      run(gw::test::staging_only{t});
    else
      run(t);
    auto& out = results[static_cast<std::size_t>(t.rank())];
    out.resize(n);
    buffer.copy_to_host(out);
  });
  REQUIRE(gw::test::count_wrong(results[0], expected, gw::test::sum_tolerance<float>(ranks)) == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(results[static_cast<std::size_t>(r)] == results[0]);  // bit-identical
}

}  // namespace

TEST_CASE("device_all_reduce in device memory across threads sums and averages like a float64 sum",
          "[cuda][collective]") {
  const int ranks = GENERATE(1, 2, 3, 4);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_device_all_reduce<false>(ranks, n, reduce_op::sum);
  check_device_all_reduce<false>(ranks, n, reduce_op::average);
}

TEST_CASE("device_all_reduce staged through pinned chunks sums and averages like a float64 sum",
          "[cuda][collective]") {
  const int ranks = GENERATE(2, 3);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1025, 100003);
  check_device_all_reduce<true>(ranks, n, reduce_op::sum);
  check_device_all_reduce<true>(ranks, n, reduce_op::average);
}

TEST_CASE("device_all_reduce across threads reports a count mismatch instead of reading past a buffer",
          "[cuda][collective]") {
  auto out = gw::test::run_collect(2, {.timeout = 20s}, [](auto& comm) {
    gw::cuda::stream stream;
    gw::cuda_tensor<float> buffer(gw::shape{comm.rank() == 0 ? 10u : 11u}, stream);
    gw::collective::device_staging staging;
    gw::collective::device_all_reduce(comm, std::span<float>(buffer.data(), buffer.size()), stream, staging);
  });
  for (auto& o : out) REQUIRE(o.kind == gw::errc::mismatch);
}
