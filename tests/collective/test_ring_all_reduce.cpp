// Ring all-reduce against a float64 serial sum, for 1..8 ranks and awkward sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <random>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;

namespace {

using gradwire::test::random_input;
// inproc without its fused receive-and-add: the ring then stages each chunk in scratch,
// the path every transport without concepts::accumulating_transport takes.
using gradwire::test::staging_only;
static_assert(gw::concepts::transport<staging_only> && !gw::concepts::accumulating_transport<staging_only, float>);

template <class V, bool Staged = false>
void check_all_reduce(int ranks, std::size_t n, reduce_op op) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op));
  std::vector<std::vector<V>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = random_input<V>(seed, r, n);
  // The reference: a serial float64 sum in rank order.
  std::vector<double> expected(n, 0.0);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) expected[i] += static_cast<double>(data[r][i]);
  if (op == reduce_op::average)
    for (auto& e : expected) e /= ranks;

  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    if constexpr (Staged) {
      gw::collective::communicator comm(staging_only{t}, {.timeout = std::chrono::seconds(60)});
      gw::collective::all_reduce(comm, std::span<V>(data[me]), op);
    } else {
      gw::collective::communicator comm(t, {.timeout = std::chrono::seconds(60)});
      gw::collective::all_reduce(comm, std::span<V>(data[me]), op);
    }
  });

  // Each element is a sum of `ranks` values in [-1, 1]: rounding is bounded by
  // ranks * eps * (sum of magnitudes) <= ranks^2 * eps.
  const double tolerance = 4.0 * ranks * ranks * std::numeric_limits<V>::epsilon();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (std::abs(static_cast<double>(data[0][i]) - expected[i]) > tolerance) ++wrong;
  REQUIRE(wrong == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);  // bit-identical everywhere
}

}  // namespace

TEMPLATE_TEST_CASE("ring all-reduce sums across 1..8 ranks for sizes 0, 1, 7, 1000003", "[collective]", float,
                   double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_all_reduce<TestType>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("ring all-reduce averages", "[collective]", float, double) {
  const int ranks = GENERATE(1, 2, 3, 5, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  check_all_reduce<TestType>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("ring all-reduce over a transport without fused accumulate stages chunks correctly",
                   "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003);
  check_all_reduce<TestType, true>(ranks, n, reduce_op::sum);
}

TEST_CASE("a communicator runs many all-reduces of changing sizes in sequence") {
  constexpr int ranks = 4;
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = std::chrono::seconds(60)});
    for (std::size_t n : {5u, 100000u, 3u, 0u, 77777u, 1u}) {
      std::vector<double> v(n, double(t.rank() + 1));
      gw::collective::all_reduce(comm, std::span<double>(v));
      for (double x : v)
        if (x != 10.0) throw std::runtime_error("size " + std::to_string(n) + ": got " + std::to_string(x));
    }
  });
  SUCCEED("no rank reported a wrong sum");
}
