// Ring all-reduce against a float64 serial sum, for 1..8 ranks and awkward sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "collective_support.hpp"
#include "helpers/call_probe.hpp"

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

// Whether the ring cuts its parts into pipeline segments on a transport that declares
// ring_segment_bytes (inproc, staging_only: 64 KiB): a part (the first, longest chunk) of at
// least two segments. Written out here, not taken from detail::ring_segments, so a change
// there cannot move a size to the other path unnoticed.
template <class V>
bool pipelined_on_inproc(int ranks, std::size_t n) {
  const std::size_t part = (n + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  return ranks > 1 && part * sizeof(V) >= 2 * gw::transport::inproc::ring_segment_bytes;
}

// The ring, named (all_reduce<ring>), against a serial float64 reference; the probe shows the
// ring ran, on this count, and pipelined or step by step as expected.
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

  std::vector<gw::test::call_log> logs(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    auto run = [&](auto transport) {
      gw::collective::communicator comm(gw::test::call_probe<decltype(transport)>{transport, &logs[me]},
                                        {.timeout = std::chrono::seconds(60)});
      gw::collective::all_reduce<gw::collective::ring>(comm, std::span<V>(data[me]), op);
    };
    if constexpr (Staged)
      run(staging_only{t});
    else if constexpr (Unsegmented)
      run(unsegmented{t});
    else
      run(t);
  });

  // Each element is a sum of `ranks` values in [-1, 1]: rounding is bounded by
  // ranks * eps * (sum of magnitudes) <= ranks^2 * eps.
  const double tolerance = 4.0 * ranks * ranks * std::numeric_limits<V>::epsilon();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!(std::abs(static_cast<double>(data[0][i]) - expected[i]) <= tolerance)) ++wrong;
  REQUIRE(wrong == 0);
  for (int r = 1; r < ranks; ++r) REQUIRE(data[r] == data[0]);  // bit-identical everywhere
  const bool pipelined = !Unsegmented && pipelined_on_inproc<V>(ranks, n);
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    if (ranks == 1) {
      REQUIRE(logs[r].calls.empty());  // one rank: nothing to check, nothing sent
      REQUIRE(logs[r].data_messages == 0);
      continue;
    }
    REQUIRE(logs[r].calls.size() == 1);
    const auto& call = logs[r].calls[0];
    REQUIRE(call.algorithm == gw::collective::algorithm_id::ring);
    REQUIRE(call.count == n);
    REQUIRE((call.segments > 1) == pipelined);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("ring all-reduce sums across 1..8 ranks for sizes 0, 1, 7, 1000003", "[collective]", float,
                   double) {
  // 1 and 7 elements leave some ranks' chunks empty (fewer elements than ranks); 1000003 is
  // pipelined in segments on every rank count from 2.
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1000003);
  check_all_reduce<TestType>(ranks, n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("ring all-reduce averages", "[collective]", float, double) {
  // Step by step (1, 13, 4099: the average scaled after the reduce-scatter) and pipelined
  // (600001: scaled segment by segment inside the pipeline).
  const int ranks = GENERATE(1, 2, 3, 5, 8);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 4099, 600001);
  check_all_reduce<TestType>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("ring all-reduce over a transport without fused accumulate stages chunks correctly",
                   "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003, 600001);
  check_all_reduce<TestType, true>(ranks, n, reduce_op::sum);
  check_all_reduce<TestType, true>(ranks, n, reduce_op::average);
}

TEMPLATE_TEST_CASE("the ring unpipelined, step by step, as over the network transports", "[collective]", float, double) {
  const int ranks = GENERATE(2, 3, 5);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 600001);
  check_all_reduce<TestType, false, true>(ranks, n, reduce_op::sum);
  check_all_reduce<TestType, false, true>(ranks, n, reduce_op::average);
}

TEST_CASE("the ring's pipeline segments keep every message step inside an operation's tag space, up to 40000 ranks") {
  using gw::collective::detail::ring_segments;
  constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
  // By hand: 2(N-1) message steps, each cut into the segments; a 64 MiB part in 256 KiB
  // segments wants 64, halved while 2(N-1) x segments reaches verify_from_left (0xfff0 =
  // 65520 tag steps): 513 ranks take 1024 x 64 = 65536 steps, too many, so 32.
  CHECK(gw::collective::detail::verify_from_left == 65520);
  CHECK(ring_segments(64 * MiB, 2, 256 * KiB) == 64);
  CHECK(ring_segments(64 * MiB, 512, 256 * KiB) == 64);  // 1022 x 64 = 65408
  CHECK(ring_segments(64 * MiB, 513, 256 * KiB) == 32);
  CHECK(ring_segments(64 * MiB, 1000, 256 * KiB) == 32);   // 1998 x 32 = 63936
  CHECK(ring_segments(64 * MiB, 4096, 256 * KiB) == 4);    // 8190 x 8 = 65520: one too many
  CHECK(ring_segments(64 * MiB, 40000, 256 * KiB) == 1);   // not pipelined
  CHECK(ring_segments(3 * 256 * KiB, 2, 256 * KiB) == 3);  // one per whole segment of the part
  CHECK(ring_segments(3 * 256 * KiB, 20000, 256 * KiB) == 1);
  CHECK(ring_segments(256 * KiB - 1, 2, 256 * KiB) == 1);
  CHECK(ring_segments(1024 * MiB, 2, 256 * KiB) == gw::collective::detail::max_ring_segments);
  CHECK(ring_segments(64 * MiB, 8, 0) == 1);  // a transport without segments
}

TEST_CASE("a communicator runs many all-reduces of changing sizes in sequence") {
  // auto_ with the default options on 4 ranks of one host: one-shot while the 3 copies a rank
  // sends fit one_shot_max_sent_bytes (64 KiB), halving-doubling below
  // small_all_reduce_bytes (128 KiB), the ring from there on. The probe shows each choice.
  constexpr int ranks = 4;
  using gw::collective::algorithm_id;
  const std::vector<std::pair<std::size_t, algorithm_id>> calls = {
      {5, algorithm_id::one_shot},      {100000, algorithm_id::ring}, {3, algorithm_id::one_shot},
      {0, algorithm_id::one_shot},      {77777, algorithm_id::ring},  {1, algorithm_id::one_shot},
      {5000, algorithm_id::halving_doubling}};  // 40 000 B: 3 copies exceed 64 KiB, below 128 KiB
  std::vector<gw::test::call_log> logs(ranks);
  REQUIRE_NOTHROW(gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(gw::test::call_probe<gw::transport::inproc>{t, &logs[t.rank()]},
                                      {.timeout = std::chrono::seconds(60)});
    for (const auto& [n, algorithm] : calls) {
      std::vector<double> v(n, double(t.rank() + 1));
      gw::collective::all_reduce(comm, std::span<double>(v));
      for (double x : v)
        if (x != 10.0) throw std::runtime_error("size " + std::to_string(n) + ": got " + std::to_string(x));
    }
  }));
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(logs[r].calls.size() == calls.size());
    for (std::size_t k = 0; k < calls.size(); ++k) {
      CAPTURE(k, calls[k].first);
      REQUIRE(logs[r].calls[k].count == calls[k].first);
      REQUIRE(logs[r].calls[k].algorithm == calls[k].second);
    }
  }
}

TEST_CASE("ranks whose transports cut the ring into different segments get a mismatch, not a hang") {
  // Rank 0 runs the ring step by step, the others pipelined: their messages differ, so the
  // call check names the segments.
  gw::transport::inproc_group group(3);
  std::vector<gw::test::call_log> logs(3);
  auto raw = group.run([&](gw::transport::inproc t) {
    std::vector<float> v(600001, 1.0f);
    if (t.rank() == 0) {
      gw::collective::communicator comm(gw::test::call_probe<unsegmented>{{t}, &logs[0]},
                                        {.timeout = std::chrono::seconds(30)});
      gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
    } else {
      gw::collective::communicator comm(gw::test::call_probe<gw::transport::inproc>{t, &logs[t.rank()]},
                                        {.timeout = std::chrono::seconds(30)});
      gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
    }
  });
  // What the ranks announced: step by step (rank 0), in segments (the others). The mismatch
  // is found in rank 0's frame, so rank 0 always sent it, and with it rank 1 or 2 (whichever
  // frame it was compared with); the other may be failed before it posts its own.
  REQUIRE(logs[0].calls.size() == 1);
  REQUIRE(logs[0].calls[0].segments <= 1);
  REQUIRE(logs[1].calls.size() + logs[2].calls.size() >= 1);
  for (int r : {1, 2})
    for (const auto& call : logs[r].calls) REQUIRE(call.segments > 1);
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
