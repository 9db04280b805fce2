// One-shot all-reduce (small buffers, one round) against a float64 serial sum; its call check and auto_'s limits.
#include <catch2/catch.hpp>

#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/one_shot_all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

template <class V, bool Staged = false>
void check_one_shot(int ranks, std::size_t n, reduce_op op) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op));
  std::vector<std::vector<V>> data(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, op == reduce_op::average);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    if constexpr (Staged) {
      gw::collective::communicator comm(gw::test::staging_only{t}, {.timeout = 30s});
      gw::collective::one_shot_all_reduce(comm, std::span<V>(data[t.rank()]), op);
    } else {
      gw::collective::communicator comm(t, {.timeout = 30s});
      gw::collective::one_shot_all_reduce(comm, std::span<V>(data[t.rank()]), op);
    }
  });
  REQUIRE(gw::test::count_wrong(data[0], expected, gw::test::sum_tolerance<V>(ranks)) == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);  // bit-identical everywhere
}

}  // namespace

TEMPLATE_TEST_CASE("one-shot all-reduce sums and averages across 1..8 ranks, in the check frames and beside them",
                   "[collective]", float, double) {
  const int ranks = GENERATE(range(1, 9));
  // Up to check_inline_bytes the neighbours' data rides in the check frames; beyond, in
  // messages of their own.
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, gw::collective::check_inline_bytes / sizeof(TestType),
                                 gw::collective::check_inline_bytes / sizeof(TestType) + 1, 3000);
  check_one_shot<TestType>(ranks, n, reduce_op::sum);
  check_one_shot<TestType>(ranks, n, reduce_op::average);
  check_one_shot<TestType, true>(ranks, n, reduce_op::sum);
  check_one_shot<TestType, true>(ranks, n, reduce_op::average);
}

TEST_CASE("one-shot with the call check off sums as well") {
  for (const std::size_t n : {std::size_t{3}, std::size_t{3000}}) {
    auto out = gw::test::run_collect(3, {.timeout = 30s, .verify = false}, [&](auto& comm) {
      std::vector<float> v(n, static_cast<float>(comm.rank() + 1));
      gw::collective::one_shot_all_reduce(comm, std::span<float>(v));
      for (float x : v) gw::test::expect(x == 6.0f, "1 + 2 + 3");
    });
    for (auto& o : out) REQUIRE(o.kind == gw::errc{});
  }
}

TEST_CASE("one-shot refuses more ranks than it takes") {
  auto out = gw::test::run_collect(gw::collective::one_shot_max_ranks + 1, {.timeout = 30s}, [](auto& comm) {
    std::vector<float> v(1, 1.0f);
    gw::collective::one_shot_all_reduce(comm, std::span<float>(v));
  });
  for (auto& o : out) REQUIRE(o.kind == gw::errc::invalid_argument);
}

namespace {
// The largest float count auto_ sends one-shot on `ranks` ranks of one host.
std::size_t one_shot_limit(int ranks) {
  return gw::collective::communicator_options{}.one_shot_max_sent_bytes / std::size_t(ranks - 1) / sizeof(float);
}
}  // namespace

TEST_CASE("auto takes one-shot while the copies a rank sends fit one_shot_max_sent_bytes, halving-doubling beyond") {
  // Which algorithm ran shows in the call check: rank 0 forces the one auto_ should pick.
  for (const auto& [ranks, n, one_shot] :
       {std::tuple{2, one_shot_limit(2), true}, std::tuple{2, one_shot_limit(2) + 1, false},
        std::tuple{4, one_shot_limit(4), true}, std::tuple{4, one_shot_limit(4) + 1, false},
        std::tuple{8, std::size_t{1}, true}, std::tuple{9, std::size_t{1}, false}}) {
    CAPTURE(ranks, n, one_shot);
    auto out = gw::test::run_collect(ranks, {.timeout = 30s}, [&](auto& comm) {
      std::vector<float> v(n, 1.0f);
      if (comm.rank() == 0 && one_shot)
        gw::collective::one_shot_all_reduce(comm, std::span<float>(v));
      else if (comm.rank() == 0)
        gw::collective::all_reduce<gw::collective::halving_doubling>(comm, std::span<float>(v));
      else
        gw::collective::all_reduce(comm, std::span<float>(v));
      if (v[0] != static_cast<float>(ranks)) throw std::runtime_error("wrong sum");
    });
    for (auto& o : out) REQUIRE(o.kind == gw::errc{});
  }
}

TEST_CASE("one-shot ranks with different counts get a mismatch naming both calls") {
  const int ranks = GENERATE(2, 3, 5);
  CAPTURE(ranks);
  auto out = gw::test::run_collect(ranks, {.timeout = 30s}, [](auto& comm) {
    std::vector<float> v(comm.rank() == 1 ? 4 : 3, 1.0f);
    gw::collective::all_reduce(comm, std::span<float>(v));
  });
  // Rank 1 and its neighbours see the disagreement; the rest learn it from them.
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(out[r].kind == gw::errc::mismatch);
  }
  REQUIRE_THAT(out[1].what, Catch::Contains("count=4") && Catch::Contains("count=3") && Catch::Contains("one_shot"));
}

TEST_CASE("counts on both sides of the one-shot limit, or of the check frame's, are a mismatch, not a wait") {
  const int ranks = GENERATE(2, 3, 4);
  const std::size_t limit = GENERATE_COPY(one_shot_limit(ranks), gw::collective::check_inline_bytes / sizeof(float));
  CAPTURE(ranks, limit);
  const auto start = std::chrono::steady_clock::now();
  auto out = gw::test::run_collect(ranks, {.timeout = 20s}, [&](auto& comm) {
    std::vector<float> v(comm.rank() == 1 ? limit + 1 : limit, 1.0f);
    gw::collective::all_reduce(comm, std::span<float>(v));
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(out[r].kind == gw::errc::mismatch);
  }
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}
