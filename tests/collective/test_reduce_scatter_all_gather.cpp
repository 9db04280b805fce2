// reduce_scatter and all_gather against float64 serial references, for 1..8 ranks and awkward sizes.
#include <catch2/catch.hpp>

#include <gradwire/collective/all_gather.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/chunking.hpp>
#include <gradwire/collective/reduce_scatter.hpp>
#include <gradwire/transport/inproc.hpp>
#include <limits>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

template <class V, bool Staged = false>
void check_reduce_scatter(int ranks, std::size_t n, reduce_op op) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op));
  std::vector<std::vector<V>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, op == reduce_op::average);
  std::vector<std::span<V>> returned(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    if constexpr (Staged) {
      gw::collective::communicator comm(gw::test::staging_only{t}, {.timeout = 60s});
      returned[me] = gw::collective::reduce_scatter(comm, std::span<V>(data[me]), op);
    } else {
      gw::collective::communicator comm(t, {.timeout = 60s});
      returned[me] = gw::collective::reduce_scatter(comm, std::span<V>(data[me]), op);
    }
  });
  const gw::collective::detail::chunking chunks{n, static_cast<std::size_t>(ranks)};
  std::size_t covered = 0;
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    // The returned span is this rank's chunk, the ring's chunking, and it is reduced.
    const auto mine = gw::collective::chunk_of(std::span<V>(data[r]), ranks, r);
    REQUIRE(returned[r].data() == mine.data());
    REQUIRE(returned[r].size() == chunks.length(r));
    REQUIRE(mine.data() == data[r].data() + chunks.begin(r));
    covered += mine.size();
    REQUIRE(gw::test::count_wrong(data[r], expected, gw::test::sum_tolerance<V>(ranks), chunks.begin(r),
                                  chunks.begin(r) + chunks.length(r)) == 0);
  }
  REQUIRE(covered == n);
}

template <class V>
void check_all_gather(int ranks, std::size_t n) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed);
  const auto truth = gw::test::random_input<V>(seed, 0, n);
  // Every rank holds only its own chunk of the truth; the rest is NaN until gathered.
  std::vector<std::vector<V>> data(ranks, std::vector<V>(n, std::numeric_limits<V>::quiet_NaN()));
  const gw::collective::detail::chunking chunks{n, static_cast<std::size_t>(ranks)};
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = chunks.begin(r); i < chunks.begin(r) + chunks.length(r); ++i) data[r][i] = truth[i];
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 60s});
    gw::collective::all_gather(comm, std::span<V>(data[t.rank()]));
  });
  for (int r = 0; r < ranks; ++r) REQUIRE(data[r] == truth);
}

}  // namespace

TEMPLATE_TEST_CASE("reduce_scatter leaves each rank its chunk summed over 1..8 ranks for sizes 0, 1, 7, 1000003",
                   "[collective]", float, double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_reduce_scatter<TestType>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("reduce_scatter averages, and stages correctly without fused accumulate", "[collective]", float,
                   double) {
  const int ranks = GENERATE(2, 3, 5, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  check_reduce_scatter<TestType>(ranks, n, reduce_op::average);
  check_reduce_scatter<TestType, true>(ranks, n, reduce_op::sum);
  check_reduce_scatter<TestType, true>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("all_gather gives every rank every chunk for 1..8 ranks and sizes 0, 1, 7, 1000003",
                   "[collective]", float, double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_all_gather<TestType>(ranks, n);
}

TEST_CASE("reduce_scatter then all_gather is an all-reduce, bit-identical on every rank") {
  const int ranks = GENERATE(3, 4, 6);
  const std::size_t n = 10007;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, seed);
  std::vector<std::vector<float>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<float>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, false);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 60s});
    std::vector<float> out(n);
    // The overload that takes this rank's chunk from elsewhere copies it into place.
    const auto mine = gw::collective::reduce_scatter(comm, std::span<float>(data[t.rank()]));
    gw::collective::all_gather(comm, std::span<const float>(mine), std::span<float>(out));
    data[t.rank()] = out;
  });
  REQUIRE(gw::test::count_wrong(data[0], expected, gw::test::sum_tolerance<float>(ranks)) == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);
}

TEST_CASE("all_gather refuses a chunk of the wrong length") {
  gw::transport::inproc_group group(1);
  gw::collective::communicator comm(group.endpoint(0));
  std::vector<float> out(5), mine(4);
  REQUIRE_THROWS_MATCHES(gw::collective::all_gather(comm, std::span<const float>(mine), std::span<float>(out)),
                         gw::error, gw::test::is_error(gw::errc::invalid_argument, {"4 elements", "has 5"}));
}

TEST_CASE("reduce_scatter and all_gather with different counts or operations name both ranks") {
  SECTION("reduce_scatter with different counts") {
    const int ranks = GENERATE(2, 3, 5);
    const int odd_one = ranks - 1;
    CAPTURE(ranks);
    auto out = gw::test::run_collect(ranks, {.timeout = 30s}, [&](auto& comm) {
      std::vector<float> v(comm.rank() == odd_one ? 99 : 100, 1.0f);
      gw::collective::reduce_scatter(comm, std::span<float>(v));
    });
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].kind == gw::errc::mismatch);
      REQUIRE_THAT(out[r].what,
                   Catch::Contains("rank " + std::to_string(odd_one) + " called reduce_scatter(count=99, dtype=f32, op=sum)") &&
                       Catch::Contains("called reduce_scatter(count=100, dtype=f32, op=sum)"));
    }
  }
  SECTION("all_gather with different dtypes") {
    auto out = gw::test::run_collect(3, {.timeout = 30s}, [](auto& comm) {
      if (comm.rank() == 2) {
        std::vector<double> v(12);
        gw::collective::all_gather(comm, std::span<double>(v));
      } else {
        std::vector<float> v(12);
        gw::collective::all_gather(comm, std::span<float>(v));
      }
    });
    for (auto& o : out) {
      CAPTURE(o.what);
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("rank 2 called all_gather(count=12, dtype=f64)") &&
                               Catch::Contains("called all_gather(count=12, dtype=f32)"));
    }
  }
  SECTION("reduce_scatter against all_gather, and against all_reduce") {
    auto out = gw::test::run_collect(3, {.timeout = 30s}, [](auto& comm) {
      std::vector<float> v(9);
      if (comm.rank() == 0) gw::collective::reduce_scatter(comm, std::span<float>(v));
      if (comm.rank() == 1) gw::collective::all_gather(comm, std::span<float>(v));
      if (comm.rank() == 2) gw::collective::all_reduce(comm, std::span<float>(v));
    });
    for (auto& o : out) {
      CAPTURE(o.what);
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("collective mismatch: rank "));
    }
  }
}
