// Halving-doubling and auto_ all-reduce against a float64 serial sum, for 1..8 ranks and awkward sizes.
#include <catch2/catch.hpp>

#include <cstring>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/halving_doubling_all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <type_traits>
#include <vector>

#include "collective_support.hpp"
#include "helpers/call_probe.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

// The algorithm a call of all_reduce<Algorithm> names in its call descriptor (auto_: the
// test says which one it must choose).
template <class Algorithm>
gw::collective::algorithm_id named_algorithm() {
  if constexpr (std::is_same_v<Algorithm, gw::collective::ring>) return gw::collective::algorithm_id::ring;
  if constexpr (std::is_same_v<Algorithm, gw::collective::halving_doubling>)
    return gw::collective::algorithm_id::halving_doubling;
  return gw::collective::algorithm_id::none;
}

// all_reduce<Algorithm> against a serial float64 reference; the probe shows which algorithm
// ran on every rank (`expected`, or the one Algorithm names).
template <class V, class Algorithm, bool Staged = false>
void check_all_reduce(int ranks, std::size_t n, reduce_op op, gw::collective::communicator_options options = {},
                      gw::collective::algorithm_id expected = named_algorithm<Algorithm>()) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op), gw::collective::name_of(expected));
  std::vector<std::vector<V>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected_values = gw::test::serial_reduce(data, op == reduce_op::average);
  options.timeout = 60s;
  std::vector<gw::test::call_log> logs(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    if constexpr (Staged) {
      gw::collective::communicator comm(gw::test::call_probe<gw::test::staging_only>{{t}, &logs[me]}, options);
      gw::collective::all_reduce<Algorithm>(comm, std::span<V>(data[me]), op);
    } else {
      gw::collective::communicator comm(gw::test::call_probe<gw::transport::inproc>{t, &logs[me]}, options);
      gw::collective::all_reduce<Algorithm>(comm, std::span<V>(data[me]), op);
    }
  });
  REQUIRE(gw::test::count_wrong(data[0], expected_values, gw::test::sum_tolerance<V>(ranks)) == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);  // bit-identical everywhere
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    if (ranks == 1) {
      REQUIRE(logs[r].calls.empty());
      continue;
    }
    REQUIRE(logs[r].calls.size() == 1);
    REQUIRE(logs[r].calls[0].count == n);
    REQUIRE(logs[r].calls[0].algorithm == expected);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("halving-doubling all-reduce sums across 1..8 ranks for sizes 0, 1, 7, 1000003", "[collective]",
                   float, double) {
  // 3, 5, 6, 7 ranks fold the extra ranks in and out (not a power of two); 1 and 7 elements
  // are fewer than the ranks taking part, so some halves and chunks are empty.
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_all_reduce<TestType, gw::collective::halving_doubling>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("halving-doubling all-reduce averages", "[collective]", float, double) {
  const int ranks = GENERATE(1, 2, 3, 5, 6, 7, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  check_all_reduce<TestType, gw::collective::halving_doubling>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("halving-doubling over a transport without fused accumulate stages correctly", "[collective]",
                   float, double) {
  const int ranks = GENERATE(2, 3, 4, 5, 7);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003);
  check_all_reduce<TestType, gw::collective::halving_doubling, true>(ranks, n, reduce_op::sum);
  check_all_reduce<TestType, gw::collective::halving_doubling, true>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("auto all-reduce is right on both sides of its threshold", "[collective]", float, double) {
  using gw::collective::algorithm_id;
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  const bool small = n * sizeof(TestType) < 1000;
  // One-shot off and a threshold of 1000 bytes in the middle of the sizes: halving-doubling
  // below it, the ring above, each asserted through the call descriptor. (No elements: the
  // no copies a rank sends fit even a limit of 0 bytes, so one-shot takes them.)
  check_all_reduce<TestType, gw::collective::auto_>(
      ranks, n, reduce_op::sum, {.one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 1000},
      n == 0 ? algorithm_id::one_shot : small ? algorithm_id::halving_doubling : algorithm_id::ring);
  // The defaults: one-shot for the small sizes (at most 8 ranks, 7 copies of 56 bytes), the
  // ring for 1000003 elements (above 128 KiB).
  check_all_reduce<TestType, gw::collective::auto_>(ranks, n, reduce_op::average, {},
                                                    small ? algorithm_id::one_shot : algorithm_id::ring);
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

// Runs a 100-float all-reduce on `ranks` ranks, rank 1 with `odd` options and the others with
// `usual`, and requires every rank's mismatch to name rank 1's algorithm and the others'.
static void require_algorithm_mismatch(int ranks, gw::collective::communicator_options odd,
                                gw::collective::communicator_options usual, const std::string& rank1_algorithm) {
  gw::transport::inproc_group group(ranks);
  auto raw = group.run([&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, t.rank() == 1 ? odd : usual);
    std::vector<float> v(100, 1.0f);
    gw::collective::all_reduce(comm, std::span<float>(v));
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(raw[r]);
    REQUIRE_THROWS_MATCHES(std::rethrow_exception(raw[r]), gw::error,
                           gw::test::is_error(gw::errc::mismatch,
                                              {"rank 1 called all_reduce(count=100, dtype=f32, op=sum) by " + rank1_algorithm,
                                               "called all_reduce(count=100, dtype=f32, op=sum) by halving_doubling"}));
  }
}

TEST_CASE("ranks that choose different all-reduce algorithms get a mismatch naming both") {
  const int ranks = GENERATE(2, 3, 5);
  CAPTURE(ranks);
  // Rank 1 has a different auto_ threshold than everyone else, so it picks the ring.
  require_algorithm_mismatch(ranks, {.timeout = 30s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 16u},
                             {.timeout = 30s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 4096u}, "ring");
}

TEST_CASE("ranks that choose one-shot and halving-doubling get a mismatch naming both: only the algorithm tells them apart") {
  // Neither is pipelined (both descriptors say 0 segments) and the count, dtype and operation
  // agree: the algorithm in the descriptor is all that differs.
  const int ranks = GENERATE(2, 3, 5);
  CAPTURE(ranks);
  require_algorithm_mismatch(ranks, {.timeout = 5s, .one_shot_max_sent_bytes = std::size_t{1} << 20, .small_all_reduce_bytes = 4096u},
                             {.timeout = 5s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 4096u}, "one_shot");
}

TEST_CASE("a communicator runs many halving-doubling all-reduces of changing sizes in sequence") {
  constexpr int ranks = 5;
  REQUIRE_NOTHROW(gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 60s});
    for (std::size_t n : {5u, 100000u, 3u, 0u, 77777u, 1u, 4u}) {
      std::vector<double> v(n, double(t.rank() + 1));
      gw::collective::all_reduce<gw::collective::halving_doubling>(comm, std::span<double>(v));
      for (double x : v)
        if (x != 15.0) throw std::runtime_error("size " + std::to_string(n) + ": got " + std::to_string(x));
    }
  }));
}
