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

// inproc without its ring_segment_bytes: the ring runs step by step, unpipelined, as it
// does over the network transports.
struct unsegmented {
  using request = gw::transport::inproc::request;
  gw::transport::inproc inner;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) { return inner.async_send(peer, tag, b); }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) { return inner.async_recv(peer, tag, b); }
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return inner.async_recv_accumulate(peer, tag, inout);
  }
  void wait(request& r, gw::deadline until) { inner.wait(r, until); }
};
static_assert(gw::concepts::accumulating_transport<unsegmented, float>);
static_assert(gw::collective::detail::ring_segment_bytes_of<unsegmented>() == 0);
static_assert(gw::collective::detail::ring_segment_bytes_of<gw::transport::inproc>() > 0);

template <class V, bool Staged = false, bool Unsegmented = false>
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
    } else if constexpr (Unsegmented) {
      gw::collective::communicator comm(unsegmented{t}, {.timeout = std::chrono::seconds(60)});
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
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099, 600001);
  check_all_reduce<TestType>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("ring all-reduce over a transport without fused accumulate stages chunks correctly",
                   "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003, 600001);
  check_all_reduce<TestType, true>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("the ring unpipelined, step by step, as over the network transports", "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>{}, 7, 600001);
  check_all_reduce<TestType, false, true>(ranks, n, reduce_op::sum);
  check_all_reduce<TestType, false, true>(ranks, n, reduce_op::average);
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

TEST_CASE("ranks whose transports cut the ring into different segments get a mismatch, not a hang") {
  // Rank 0 runs the ring step by step, the others pipelined: their messages differ, so the
  // call check names the segments.
  gw::transport::inproc_group group(3);
  auto raw = group.run([&](gw::transport::inproc t) {
    std::vector<float> v(600001, 1.0f);
    if (t.rank() == 0) {
      gw::collective::communicator comm(unsegmented{t}, {.timeout = std::chrono::seconds(30)});
      gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
    } else {
      gw::collective::communicator comm(t, {.timeout = std::chrono::seconds(30)});
      gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
    }
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(raw[r]);
    try {
      std::rethrow_exception(raw[r]);
    } catch (const gw::error& e) {
      CAPTURE(e.what());
      REQUIRE(e.kind() == gw::errc::mismatch);
      REQUIRE_THAT(std::string(e.what()), Catch::Contains("by ring in ") && Catch::Contains(" segments"));
    }
  }
}
