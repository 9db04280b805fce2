// Halving-doubling and auto_ all-reduce against a float64 serial sum, for 1..8 ranks and awkward sizes.
#include <catch2/catch.hpp>

#include <cstring>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/halving_doubling_all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

template <class V, class Algorithm, bool Staged = false>
void check_all_reduce(int ranks, std::size_t n, reduce_op op, gw::collective::communicator_options options = {}) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op));
  std::vector<std::vector<V>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, op == reduce_op::average);
  options.timeout = 60s;
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    if constexpr (Staged) {
      gw::collective::communicator comm(gw::test::staging_only{t}, options);
      gw::collective::all_reduce<Algorithm>(comm, std::span<V>(data[me]), op);
    } else {
      gw::collective::communicator comm(t, options);
      gw::collective::all_reduce<Algorithm>(comm, std::span<V>(data[me]), op);
    }
  });
  REQUIRE(gw::test::count_wrong(data[0], expected, gw::test::sum_tolerance<V>(ranks)) == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);  // bit-identical everywhere
}

}  // namespace

TEMPLATE_TEST_CASE("halving-doubling all-reduce sums across 1..8 ranks for sizes 0, 1, 7, 1000003", "[collective]",
                   float, double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_all_reduce<TestType, gw::collective::halving_doubling>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("halving-doubling all-reduce averages", "[collective]", float, double) {
  const int ranks = GENERATE(1, 2, 3, 5, 6, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  check_all_reduce<TestType, gw::collective::halving_doubling>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("halving-doubling over a transport without fused accumulate stages correctly", "[collective]",
                   float, double) {
  const int ranks = GENERATE(2, 3, 4, 5, 7);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003);
  check_all_reduce<TestType, gw::collective::halving_doubling, true>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("auto all-reduce is right on both sides of its threshold", "[collective]", float, double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  // A threshold in the middle of the sizes, so both algorithms run.
  check_all_reduce<TestType, gw::collective::auto_>(ranks, n, reduce_op::sum, {.small_all_reduce_bytes = 1000});
  check_all_reduce<TestType, gw::collective::auto_>(ranks, n, reduce_op::average);
}

TEST_CASE("auto picks halving-doubling below the threshold and the ring from it on") {
  // Which algorithm ran shows in the call check: one rank forces the algorithm auto_
  // should have picked, the others use auto_; no mismatch means auto_ agreed.
  for (std::size_t n : {std::size_t(255), std::size_t(256)}) {
    CAPTURE(n);
    auto out = gw::test::run_collect(3, {.timeout = 30s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 1024}, [&](auto& comm) {
      std::vector<float> v(n, 1.0f);
      if (comm.rank() == 0) {
        if (n * sizeof(float) < 1024)
          gw::collective::all_reduce<gw::collective::halving_doubling>(comm, std::span<float>(v));
        else
          gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
      } else {
        gw::collective::all_reduce(comm, std::span<float>(v));
      }
      if (v[0] != 3.0f) throw std::runtime_error("wrong sum");
    });
    for (auto& o : out) REQUIRE(o.kind == gw::errc{});
  }
}

TEST_CASE("ranks that choose different all-reduce algorithms get a mismatch naming both") {
  const int ranks = GENERATE(2, 3, 5);
  CAPTURE(ranks);
  // Rank 1 has a different auto_ threshold than everyone else, so it picks the ring.
  gw::transport::inproc_group group(ranks);
  auto raw = group.run([&](gw::transport::inproc t) {
    gw::collective::communicator comm(
        t, {.timeout = 30s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = t.rank() == 1 ? 16u : 4096u});
    std::vector<float> v(100, 1.0f);
    gw::collective::all_reduce(comm, std::span<float>(v));
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(raw[r]);
    REQUIRE_THROWS_MATCHES(std::rethrow_exception(raw[r]), gw::error,
                           gw::test::is_error(gw::errc::mismatch,
                                              {"rank 1 called all_reduce(count=100, dtype=f32, op=sum) by ring",
                                               "called all_reduce(count=100, dtype=f32, op=sum) by halving_doubling"}));
  }
}

TEST_CASE("a communicator runs many halving-doubling all-reduces of changing sizes in sequence") {
  constexpr int ranks = 5;
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 60s});
    for (std::size_t n : {5u, 100000u, 3u, 0u, 77777u, 1u, 4u}) {
      std::vector<double> v(n, double(t.rank() + 1));
      gw::collective::all_reduce<gw::collective::halving_doubling>(comm, std::span<double>(v));
      for (double x : v)
        if (x != 15.0) throw std::runtime_error("size " + std::to_string(n) + ": got " + std::to_string(x));
    }
  });
  SUCCEED("no rank reported a wrong sum");
}
