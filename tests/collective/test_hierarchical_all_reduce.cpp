// Hierarchical all-reduce on threads placed on pretend hosts: against a float64 serial sum, bit-identical, auto_'s choice.
#include <catch2/catch.hpp>

#include <cstring>
#include <gradwire/support/topology.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/hierarchical_all_reduce.hpp>
#include <gradwire/transport/inproc.hpp>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::cluster::topology;
using gw::collective::reduce_op;
using namespace std::chrono_literals;

namespace {

// The hosts under test, as a host label per rank.
std::map<std::string, std::vector<int>> layouts() {
  return {{"2x2", {0, 0, 1, 1}},
          {"2x2 interleaved", {0, 1, 0, 1}},
          {"2x4", {0, 0, 0, 0, 1, 1, 1, 1}},
          {"4x1", {0, 1, 2, 3}},
          {"1,2,3", {0, 1, 1, 2, 2, 2}},
          {"3,2,1", {0, 0, 0, 1, 1, 2}},
          {"non-contiguous 0,1,0,2,1,2", {0, 1, 0, 2, 1, 2}},
          {"one host", {0, 0, 0}}};
}

// staging_only (no fused receive-and-add) that still tells the hosts.
struct staging_with_topology : gw::test::staging_only {
  const gw::cluster::topology& topology() const { return inner.topology(); }
};

template <class V, bool Staged = false>
void check_hierarchical(const std::vector<int>& hosts, std::size_t n, reduce_op op) {
  const int ranks = static_cast<int>(hosts.size());
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, n, seed, static_cast<int>(op));
  std::vector<std::vector<V>> data(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) data[r] = gw::test::random_input<V>(seed, r, n);
  const auto expected = gw::test::serial_reduce(data, op == reduce_op::average);
  gw::transport::run_inproc(topology(hosts), [&](gw::transport::inproc t) {
    const int me = t.rank();
    if constexpr (Staged) {
      gw::collective::communicator comm(staging_with_topology{{t}}, {.timeout = 60s});
      gw::test::expect(comm.host_count() == topology(hosts).host_count(), "the communicator sees the hosts");
      gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<V>(data[me]), op);
    } else {
      gw::collective::communicator comm(t, {.timeout = 60s});
      gw::test::expect(comm.host_count() == topology(hosts).host_count(), "the communicator sees the hosts");
      gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<V>(data[me]), op);
    }
  });
  REQUIRE(gw::test::count_wrong(data[0], expected, gw::test::sum_tolerance<V>(ranks)) == 0);
  // (n == 0: an empty vector's data is null, which memcmp may not be given.)
  for (int r = 1; r < ranks; ++r) REQUIRE((n == 0 || std::memcmp(data[r].data(), data[0].data(), n * sizeof(V)) == 0));
}

// inproc that counts the payload each rank sends to ranks on other hosts.
struct cross_host_meter {
  using request = gw::transport::inproc::request;
  gw::transport::inproc inner;
  std::size_t* across;  // this rank's counter
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  const gw::cluster::topology& topology() const { return inner.topology(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) {
    if (inner.topology().host(peer) != inner.topology().host(rank())) *across += b.size();
    return inner.async_send(peer, tag, b);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) { return inner.async_recv(peer, tag, b); }
  void wait(request& r, gw::deadline until) { inner.wait(r, until); }
};
static_assert(gw::concepts::topology_aware_transport<cross_host_meter>);

template <class Algorithm>
std::size_t bytes_across_hosts(const std::vector<int>& hosts, std::size_t n) {
  std::vector<std::size_t> across(hosts.size(), 0);
  gw::transport::run_inproc(topology(hosts), [&](gw::transport::inproc t) {
    const int me = t.rank();
    gw::collective::communicator comm(cross_host_meter{t, &across[me]}, {.timeout = 60s, .verify = false});
    std::vector<float> v(n, float(me));
    gw::collective::all_reduce<Algorithm>(comm, std::span<float>(v));
    for (float x : v) gw::test::expect(x == float(hosts.size() * (hosts.size() - 1) / 2), "sum of the ranks");
  });
  std::size_t total = 0;
  for (auto a : across) total += a;
  return total;
}

}  // namespace

TEMPLATE_TEST_CASE("hierarchical all-reduce sums on even, uneven and non-contiguous hosts", "[collective][hierarchical]",
                   float, double) {
  const auto all = layouts();
  const auto name = GENERATE(from_range(std::vector<std::string>{"2x2", "2x2 interleaved", "2x4", "4x1", "1,2,3",
                                                                  "3,2,1", "non-contiguous 0,1,0,2,1,2", "one host"}));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 2, 3, 7, 1000003);
  CAPTURE(name);
  check_hierarchical<TestType>(all.at(name), n, reduce_op::sum);
}

TEMPLATE_TEST_CASE("hierarchical all-reduce averages", "[collective][hierarchical]", float, double) {
  const auto all = layouts();
  const auto name = GENERATE(from_range(std::vector<std::string>{"2x2", "2x4", "1,2,3", "non-contiguous 0,1,0,2,1,2",
                                                                  "one host"}));
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 13, 40999);
  CAPTURE(name);
  check_hierarchical<TestType>(all.at(name), n, reduce_op::average);
}

TEMPLATE_TEST_CASE("hierarchical all-reduce over a transport without fused accumulate stages correctly",
                   "[collective][hierarchical]", float, double) {
  const auto all = layouts();
  const auto name = GENERATE(from_range(std::vector<std::string>{"2x2", "1,2,3", "non-contiguous 0,1,0,2,1,2"}));
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 100003);
  CAPTURE(name);
  check_hierarchical<TestType, true>(all.at(name), n, reduce_op::sum);
  check_hierarchical<TestType, true>(all.at(name), n, reduce_op::average);
}

TEMPLATE_TEST_CASE("hierarchical all-reduce pipelines buffers from 4 MiB on in segments, also on uneven hosts",
                   "[collective][hierarchical]", float, double) {
  const auto all = layouts();
  const auto name = GENERATE(from_range(std::vector<std::string>{"2x4", "1,2,3", "non-contiguous 0,1,0,2,1,2"}));
  // Just over 4 MiB (8 segments) and 8 MiB (16), neither a multiple of anything the phases cut by.
  const std::size_t n = GENERATE(as<std::size_t>{}, (std::size_t{4} << 20) / sizeof(TestType) + 5,
                                 (std::size_t{8} << 20) / sizeof(TestType) + 7);
  CAPTURE(name);
  const topology topo(all.at(name));
  const auto per_segment = gw::collective::detail::hierarchical_steps(topo.max_local_size(), topo.host_count());
  REQUIRE(gw::collective::detail::hierarchical_segments(n * sizeof(TestType), per_segment) > 1);
  check_hierarchical<TestType>(all.at(name), n, reduce_op::sum);
  check_hierarchical<TestType>(all.at(name), n, reduce_op::average);
  check_hierarchical<TestType, true>(all.at(name), n, reduce_op::sum);
  check_hierarchical<TestType, true>(all.at(name), n, reduce_op::average);
}

TEST_CASE("hierarchical all-reduce sends each host's share across once, not a flat ring's", "[collective][hierarchical]") {
  // H hosts of P ranks, n divisible by P * H: each host sends 2(H-1)/H of the buffer
  // across in all (its P ranks 1/P each), so 2(H-1) buffers over the whole job. A flat
  // ring over contiguous hosts sends 2(N-1)/N of the buffer over each of its H cross-host links.
  const std::size_t n = 8 * 3 * 1000, bytes = n * sizeof(float);
  for (const auto& [hosts, h] : {std::pair{std::vector<int>{0, 0, 1, 1}, 2}, std::pair{std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}, 2},
                                 std::pair{std::vector<int>{0, 0, 1, 1, 2, 2}, 3}}) {
    const std::size_t ranks = hosts.size();
    CAPTURE(ranks, h);
    CHECK(bytes_across_hosts<gw::collective::hierarchical>(hosts, n) == 2 * std::size_t(h - 1) * bytes);
    CHECK(bytes_across_hosts<gw::collective::ring>(hosts, n) == std::size_t(h) * 2 * (ranks - 1) * bytes / ranks);
  }
}

TEST_CASE("auto picks hierarchical from hierarchical_min_bytes on when ranks span hosts and share one",
          "[collective][hierarchical]") {
  // Which algorithm ran shows in the call check: rank 0 forces the algorithm auto_ should
  // pick, the others use auto_; no mismatch means auto_ agreed.
  struct expectation {
    std::vector<int> hosts;
    std::size_t count;
    const char* algorithm;
  };
  // (One-shot off, on one host as across: these counts would take it on one host.)
  const gw::collective::communicator_options options{
      .timeout = 30s, .one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 8192, .hierarchical_min_bytes = 4096};
  for (const auto& e : {expectation{{0, 0, 1, 1}, 1024, "hierarchical"}, expectation{{0, 0, 1, 1}, 1023, "halving_doubling"},
                        expectation{{0, 1, 0, 1, 2}, 5000, "hierarchical"}, expectation{{0, 1, 2, 3}, 1024, "halving_doubling"},
                        expectation{{0, 1, 2, 3}, 4096, "ring"}, expectation{{0, 0, 0, 0}, 1024, "halving_doubling"},
                        expectation{{0, 0, 0, 0}, 4096, "ring"}}) {
    CAPTURE(e.hosts, e.count, e.algorithm);
    gw::transport::inproc_group group{topology(e.hosts)};
    auto raw = group.run([&](gw::transport::inproc t) {
      gw::collective::communicator comm(t, options);
      std::vector<float> v(e.count, 1.0f);
      const std::string want = e.algorithm;
      if (comm.rank() != 0)
        gw::collective::all_reduce(comm, std::span<float>(v));
      else if (want == "hierarchical")
        gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<float>(v));
      else if (want == "ring")
        gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
      else
        gw::collective::all_reduce<gw::collective::halving_doubling>(comm, std::span<float>(v));
      gw::test::expect(v[0] == float(e.hosts.size()), "sum");
    });
    for (auto& r : raw) CHECK_NOTHROW(r ? std::rethrow_exception(r) : void());
  }
}

TEST_CASE("ranks that run hierarchical against ranks that run the ring get a mismatch naming both",
          "[collective][hierarchical]") {
  // Also on one host, where hierarchical runs the ring's messages: the check still tells.
  for (const auto& hosts : {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 0}}) {
    CAPTURE(hosts);
    gw::transport::inproc_group group{topology(hosts)};
    auto raw = group.run([&](gw::transport::inproc t) {
      gw::collective::communicator comm(t, {.timeout = 30s});
      std::vector<float> v(100, 1.0f);
      if (comm.rank() == 1)
        gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
      else
        gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<float>(v));
    });
    for (std::size_t r = 0; r < raw.size(); ++r) {
      CAPTURE(r);
      REQUIRE(raw[r]);
      REQUIRE_THROWS_MATCHES(std::rethrow_exception(raw[r]), gw::error,
                             gw::test::is_error(gw::errc::mismatch,
                                                {"rank 1 called all_reduce(count=100, dtype=f32, op=sum) by ring",
                                                 "called all_reduce(count=100, dtype=f32, op=sum) by hierarchical"}));
    }
  }
}

TEST_CASE("a communicator runs many hierarchical all-reduces of changing sizes in sequence", "[collective][hierarchical]") {
  REQUIRE_NOTHROW(gw::transport::run_inproc(topology({0, 1, 1, 2, 2, 2}), [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 60s});
    for (std::size_t n : {5u, 100000u, 3u, 0u, 77777u, 1u, 6u}) {
      std::vector<double> v(n, double(t.rank() + 1));
      gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<double>(v));
      for (double x : v)
        if (x != 21.0) throw std::runtime_error("size " + std::to_string(n) + ": got " + std::to_string(x));
    }
  }));
}

TEST_CASE("the communicator reports the transport's topology, and one host without one", "[collective][hierarchical]") {
  REQUIRE_NOTHROW(gw::transport::run_inproc(topology({0, 1, 0, 2, 1, 2}), [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 30s});
    const int me = comm.rank();
    gw::test::expect(comm.host_count() == 3 && comm.host_index() == (me == 0 || me == 2 ? 0 : me == 1 || me == 4 ? 1 : 2),
                     "host index");
    gw::test::expect(comm.local_size() == 2 && comm.local_rank() == (me == 0 || me == 1 || me == 3 ? 0 : 1), "local rank and size");
    gw::collective::communicator staged(gw::test::staging_only{t}, {.timeout = 30s});
    gw::test::expect(staged.host_count() == 1 && staged.local_rank() == me && staged.local_size() == 6,
                     "a transport without a topology is one host");
  }));
}

TEST_CASE("a hierarchical program keeps each segment inside its own tag steps, and every send meets one receive",
          "[collective][hierarchical]") {
  // Segments run side by side and the call check's frames sit at the top of the tag space,
  // so a message under another segment's tag step could be taken by the wrong receive.
  using step = gw::collective::detail::hierarchical_step<float>;
  for (const auto& [name, hosts] : layouts()) {
    CAPTURE(name);
    const topology topo(hosts);
    const int size = static_cast<int>(hosts.size()), segments = 3;
    const auto per_segment = gw::collective::detail::hierarchical_steps(topo.max_local_size(), topo.host_count());
    std::vector<std::vector<float>> data(static_cast<std::size_t>(size), std::vector<float>(999));
    std::vector<std::vector<step>> programs(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      auto& buffer = data[static_cast<std::size_t>(r)];
      for (int k = 0; k < segments; ++k)
        gw::collective::detail::hierarchical_program(topo, r, std::span<float>(buffer).subspan(333 * k, 333), k, per_segment,
                                                     programs[static_cast<std::size_t>(r)]);
    }
    // (from, to, tag step) -> size and round, for sends and receives.
    std::map<std::tuple<int, int, std::uint32_t>, std::pair<std::size_t, std::uint32_t>> sends, receives;
    for (int r = 0; r < size; ++r)
      for (const step& s : programs[static_cast<std::size_t>(r)]) {
        CAPTURE(r, s.segment, s.tag_step);
        REQUIRE(s.tag_step >= per_segment * static_cast<std::uint32_t>(s.segment));
        REQUIRE(s.tag_step < per_segment * static_cast<std::uint32_t>(s.segment + 1));
        REQUIRE(sends.emplace(std::tuple{r, s.to, s.tag_step}, std::pair{s.out.size(), s.round}).second);
        REQUIRE(receives.emplace(std::tuple{s.from, r, s.tag_step}, std::pair{s.in.size(), s.round}).second);
      }
    CHECK(sends == receives);
    CHECK(per_segment * segments < gw::collective::detail::verify_from_left);
  }
}
