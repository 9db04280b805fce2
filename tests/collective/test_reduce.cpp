// reduce onto every root against float64 serial references, for 1..8 ranks and awkward sizes; mismatches.
#include <catch2/catch.hpp>

#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

// Reduces the same fresh random inputs onto each root in turn (one job; every rank
// restarts from its input, since reduce uses non-root buffers as working space) and
// checks each root's result. Non-root buffers end with algorithm-dependent partial sums:
// not checked.
template <class V, bool Staged = false>
void check_reduce(int ranks, std::size_t n, reduce_op op, gw::collective::communicator_options options = {.timeout = 60s}) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op), options.small_all_reduce_bytes);
  std::vector<std::vector<V>> inputs(ranks);
  for (int r = 0; r < ranks; ++r) inputs[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(inputs, op == reduce_op::average);
  std::vector<std::vector<V>> results(ranks);  // [root]
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    std::vector<V> work(n);
    auto run = [&](auto& comm) {
      for (int root = 0; root < ranks; ++root) {
        work = inputs[me];
        gw::collective::reduce(comm, std::span<V>(work), root, op);
        if (me == root) results[root] = work;
      }
    };
    if constexpr (Staged) {
      gw::collective::communicator comm(gw::test::staging_only{t}, options);
      run(comm);
    } else {
      gw::collective::communicator comm(t, options);
      run(comm);
    }
  });
  for (int root = 0; root < ranks; ++root) {
    CAPTURE(root);
    REQUIRE(gw::test::count_wrong(results[root], expected, gw::test::sum_tolerance<V>(ranks)) == 0);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("reduce sums onto every root for 1..8 ranks and sizes 0, 1, 7, 1000003", "[collective]", float,
                   double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_reduce<TestType>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("reduce averages, stages without fused accumulate, and runs either algorithm at any size",
                   "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  check_reduce<TestType>(ranks, n, reduce_op::average);
  check_reduce<TestType, true>(ranks, n, reduce_op::sum);
  // Threshold 1 byte: reduce-scatter + gather even for tiny messages (chunks empty when
  // n < ranks); threshold huge: the binomial tree, staged, for the large size too.
  check_reduce<TestType>(ranks, n, reduce_op::sum, {.timeout = 60s, .small_all_reduce_bytes = 1});
  check_reduce<TestType, true>(ranks, n, reduce_op::average, {.timeout = 60s, .small_all_reduce_bytes = 1});
  check_reduce<TestType, true>(ranks, 100003, reduce_op::sum, {.timeout = 60s, .small_all_reduce_bytes = 1 << 30});
}

TEST_CASE("reduce refuses a root outside the job") {
  gw::transport::inproc_group group(1);
  gw::collective::communicator comm(group.endpoint(0));
  std::vector<float> v(3);
  REQUIRE_THROWS_MATCHES(gw::collective::reduce(comm, std::span<float>(v), 1), gw::error,
                         gw::test::is_error(gw::errc::invalid_argument, {"root 1 outside 0..0"}));
  REQUIRE_THROWS_MATCHES(gw::collective::reduce(comm, std::span<float>(v), -1), gw::error,
                         gw::test::is_error(gw::errc::invalid_argument, {"root -1"}));
}

TEST_CASE("reduce with different roots or counts names both ranks") {
  SECTION("different counts") {
    const int ranks = GENERATE(2, 3, 5);
    const int odd_one = ranks - 1;
    CAPTURE(ranks);
    auto out = gw::test::run_collect(ranks, {.timeout = 30s}, [&](auto& comm) {
      std::vector<float> v(comm.rank() == odd_one ? 99 : 100, 1.0f);
      gw::collective::reduce(comm, std::span<float>(v), 0);
      // A leaf whose peers agreed may finish its part (its send is taken) before the
      // root finds the mismatch; the job's failure then reaches it in its next call.
      gw::collective::barrier(comm);
    });
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].kind == gw::errc::mismatch);
      REQUIRE_THAT(out[r].what, Catch::Contains("rank " + std::to_string(odd_one) + " called reduce(count=99, dtype=f32)") &&
                                    Catch::Contains("called reduce(count=100, dtype=f32)"));
    }
  }
  SECTION("different roots") {
    // Rank 1 reduces onto itself, the others onto 0: its neighbours 0 and 2 see it.
    auto out = gw::test::run_collect(3, {.timeout = 30s}, [](auto& comm) {
      std::vector<double> v(10, 1.0);
      gw::collective::reduce(comm, std::span<double>(v), comm.rank() == 1 ? 1 : 0);
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].kind == gw::errc::mismatch);
      REQUIRE_THAT(out[r].what, Catch::Contains("collective mismatch: rank ") && Catch::Contains("rank 1 called reduce(") &&
                                    (Catch::Contains("rank 0 called reduce(") || Catch::Contains("rank 2 called reduce(")));
    }
  }
}
