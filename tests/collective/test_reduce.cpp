// reduce onto every root against float64 serial references, for 1..8 ranks and awkward sizes; mismatches.
#include <catch2/catch.hpp>

#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <limits>
#include <vector>

#include "collective_support.hpp"
#include "helpers/call_probe.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

// reduce has no algorithm argument: communicator_options::small_all_reduce_bytes picks it
// (and 1 or 2 ranks always take the tree). The tests set it to force one and assert through
// the call descriptor (its argument carries 0x80 for scatter-gather) that it ran.
enum class reduce_algorithm { tree, scatter_gather };
const char* name_of(reduce_algorithm a) { return a == reduce_algorithm::tree ? "tree" : "scatter_gather"; }
gw::collective::communicator_options forcing(reduce_algorithm a) {
  return {.timeout = 60s,
          .small_all_reduce_bytes = a == reduce_algorithm::tree ? std::numeric_limits<std::size_t>::max() : 1};
}

// Reduces the same fresh random inputs onto each root in turn (one job; every rank
// restarts from its input, since reduce uses non-root buffers as working space) and
// checks each root's result. Non-root buffers end with algorithm-dependent partial sums:
// not checked.
template <class V, bool Staged = false>
void check_reduce(int ranks, std::size_t n, reduce_op op, reduce_algorithm algorithm,
                  gw::collective::communicator_options options) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op), name_of(algorithm), options.small_all_reduce_bytes);
  std::vector<std::vector<V>> inputs(ranks);
  for (int r = 0; r < ranks; ++r) inputs[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(inputs, op == reduce_op::average);
  std::vector<std::vector<V>> results(ranks);  // [root]
  std::vector<gw::test::call_log> logs(static_cast<std::size_t>(ranks));
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
      gw::collective::communicator comm(gw::test::call_probe<gw::test::staging_only>{{t}, &logs[me]}, options);
      run(comm);
    } else {
      gw::collective::communicator comm(gw::test::call_probe<gw::transport::inproc>{t, &logs[me]}, options);
      run(comm);
    }
  });
  for (int root = 0; root < ranks; ++root) {
    CAPTURE(root);
    REQUIRE(gw::test::count_wrong(results[root], expected, gw::test::sum_tolerance<V>(ranks)) == 0);
  }
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(logs[r].calls.size() == (ranks == 1 ? 0u : static_cast<std::size_t>(ranks)));
    for (const auto& call : logs[r].calls) {
      REQUIRE(call.op == gw::collective::operation::reduce);
      REQUIRE(call.count == n);
      REQUIRE(((call.argument & 0x80u) != 0) == (algorithm == reduce_algorithm::scatter_gather));
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("reduce by binomial tree sums onto every root for 1..8 ranks and sizes 0, 1, 7, 100003",
                   "[collective]", float, double) {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003);
  check_reduce<TestType>(ranks, n, reduce_op::sum, reduce_algorithm::tree, forcing(reduce_algorithm::tree));
}

TEMPLATE_TEST_CASE("reduce by ring reduce-scatter and gather sums onto every root for 3..8 ranks and sizes 1, 7, 1000003",
                   "[collective]", float, double) {
  // 1 and 7 elements are fewer than the ranks: some chunks are empty and are not gathered.
  const int ranks = GENERATE(range(3, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1000003);
  check_reduce<TestType>(ranks, n, reduce_op::sum, reduce_algorithm::scatter_gather,
                         forcing(reduce_algorithm::scatter_gather));
}

TEMPLATE_TEST_CASE("reduce averages and stages without fused accumulate by either algorithm", "[collective]", float,
                   double) {
  const int ranks = GENERATE(3, 5, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099);
  for (const auto a : {reduce_algorithm::tree, reduce_algorithm::scatter_gather}) {
    check_reduce<TestType>(ranks, n, reduce_op::average, a, forcing(a));
    check_reduce<TestType, true>(ranks, n, reduce_op::sum, a, forcing(a));
    check_reduce<TestType, true>(ranks, n, reduce_op::average, a, forcing(a));
  }
  check_reduce<TestType, true>(ranks, 100003, reduce_op::sum, reduce_algorithm::tree, forcing(reduce_algorithm::tree));
}

TEST_CASE("reduce takes the tree below small_all_reduce_bytes and on 2 ranks, scatter-gather from it on") {
  const std::size_t threshold = gw::collective::communicator_options{}.small_all_reduce_bytes;
  const std::size_t below = threshold / sizeof(float) - 1, at = threshold / sizeof(float);
  check_reduce<float>(3, below, reduce_op::sum, reduce_algorithm::tree, {.timeout = 60s});
  check_reduce<float>(3, at, reduce_op::sum, reduce_algorithm::scatter_gather, {.timeout = 60s});
  check_reduce<float>(2, at, reduce_op::sum, reduce_algorithm::tree, {.timeout = 60s});  // N <= 2: the tree
  check_reduce<float>(2, 7, reduce_op::average, reduce_algorithm::tree, forcing(reduce_algorithm::scatter_gather));
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
