// cluster::topology (numbering, local ranks), host identities (GRADWIRE_HOST_ID, network namespaces), and their exchange at join.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <gradwire/cluster/tcp.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/rendezvous/host_identity.hpp>
#include <gradwire/rendezvous/store.hpp>
#include <gradwire/support/topology.hpp>
#include <gradwire/transport/any.hpp>
#include <gradwire/transport/asio_tcp.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "helpers/reference.hpp"

namespace gw = gradwire;
using gw::cluster::topology;
using namespace std::chrono_literals;

namespace {

std::vector<int> list(std::span<const int> s) { return {s.begin(), s.end()}; }

// A port that was free a moment ago, for a rendezvous store.
std::uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// Runs fn(rank) on `n` threads and rethrows the first failure.
template <class Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A rendezvous store of one's own (concepts::rendezvous_store): a map in this process,
// shared by rank threads, each holding its own handle (as each holds its own store_client).
class memory_store {
 public:
  struct shared {
    std::mutex m;
    std::condition_variable cv;
    std::map<std::string, std::vector<std::byte>> values;
  };
  explicit memory_store(shared& s) : s_(&s) {}

  void set(const std::string& key, std::span<const std::byte> value) {
    {
      std::lock_guard lock(s_->m);
      s_->values[key].assign(value.begin(), value.end());
    }
    s_->cv.notify_all();
  }
  std::vector<std::byte> get(const std::string& key) {
    std::unique_lock lock(s_->m);
    if (!s_->cv.wait_for(lock, timeout_, [&] { return s_->values.contains(key); }))
      throw gw::error(gw::errc::timeout, "memory_store: nobody set " + key);
    return s_->values.at(key);
  }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  shared* s_;
  std::chrono::milliseconds timeout_{gw::default_timeout};
};
static_assert(gw::concepts::rendezvous_store<memory_store>);

}  // namespace

TEST_CASE("topology numbers hosts by first appearance and ranks within each host in rank order", "[cluster][topology]") {
  const topology t({7, 3, 7, 9, 3, 9});
  REQUIRE(t.size() == 6);
  REQUIRE(t.host_count() == 3);
  CHECK(std::vector<int>{t.host(0), t.host(1), t.host(2), t.host(3), t.host(4), t.host(5)} ==
        std::vector<int>{0, 1, 0, 2, 1, 2});
  CHECK(list(t.ranks_on(0)) == std::vector<int>{0, 2});
  CHECK(list(t.ranks_on(1)) == std::vector<int>{1, 4});
  CHECK(list(t.ranks_on(2)) == std::vector<int>{3, 5});
  CHECK(std::vector<int>{t.local_rank(0), t.local_rank(1), t.local_rank(2), t.local_rank(3), t.local_rank(4),
                         t.local_rank(5)} == std::vector<int>{0, 0, 1, 0, 1, 1});
  for (int r = 0; r < 6; ++r) CHECK(t.local_size(r) == 2);
  CHECK(t.spans_hosts_with_shared_host());
  CHECK(t.to_string() == "3 hosts: 0 (host0) ranks 0,2; 1 (host1) ranks 1,4; 2 (host2) ranks 3,5");

  const topology uneven({0, 1, 1, 2, 2, 2});
  CHECK(uneven.max_local_size() == 3);
  CHECK(std::vector<int>{uneven.local_size(0), uneven.local_size(1), uneven.local_size(5)} == std::vector<int>{1, 2, 3});
  CHECK(uneven.local_rank(5) == 2);
}

TEST_CASE("topology says when there is a hierarchy to use", "[cluster][topology]") {
  CHECK_FALSE(topology::one_host(4).spans_hosts_with_shared_host());  // one host
  CHECK_FALSE(topology({0, 1, 2, 3}).spans_hosts_with_shared_host());  // one rank per host
  CHECK(topology({0, 1, 1}).spans_hosts_with_shared_host());
  const auto one = topology::one_host(3, "box");
  CHECK(one.host_count() == 1);
  CHECK(one.host_name(0) == "box");
  CHECK(one.local_rank(2) == 2);
  CHECK(one.local_size(0) == 3);
  CHECK(topology().size() == 1);
}

TEST_CASE("topology from published host identities names each host by its lowest rank's name", "[cluster][topology]") {
  const std::vector<std::string> ids{"b/boot/1", "a/boot/1", "b/boot/1", "a/boot/2"};
  const std::vector<std::string> names{"10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.3"};
  const auto t = topology::from_identities(ids, names);
  CHECK(t.host_count() == 3);  // same hostname, other network namespace: another host
  CHECK(t.host(2) == 0);
  CHECK(t.host_name(0) == "10.0.0.2");
  CHECK(t.host_name(1) == "10.0.0.1");
  CHECK(t.host_name(2) == "10.0.0.3");
  CHECK_THROWS_MATCHES(topology::from_identities(ids, std::vector<std::string>{"x"}), gw::error,
                       gw::test::is_error(gw::errc::invalid_argument, {"1 display names for 4 ranks"}));
  CHECK_THROWS_MATCHES(topology(std::vector<int>{}), gw::error, gw::test::is_error(gw::errc::invalid_argument));
  CHECK_THROWS_MATCHES(t.host(4), gw::error, gw::test::is_error(gw::errc::invalid_argument, {"rank 4 outside 0..3"}));
}

TEST_CASE("host identity: GRADWIRE_HOST_ID, else hostname, boot id and network namespace", "[cluster][topology]") {
  CHECK(gw::rendezvous::local_host_identity("given") == "given");
  ::setenv("GRADWIRE_HOST_ID", "rack3-node7", 1);
  CHECK(gw::rendezvous::local_host_identity() == "rack3-node7");
  ::unsetenv("GRADWIRE_HOST_ID");
  const std::string id = gw::rendezvous::local_host_identity();
  struct stat ns {};
  REQUIRE(::stat("/proc/self/ns/net", &ns) == 0);
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  CAPTURE(id);
  CHECK(id.rfind(std::string(name) + "/", 0) == 0);
  CHECK(id.ends_with("/" + std::to_string(ns.st_ino)));
  CHECK(id.size() > std::string(name).size() + 30);  // the boot id (a UUID) is in the middle
  // cluster::tcp_options hands GRADWIRE_HOST_ID to the transport.
  gw::cluster::cluster_spec spec;
  spec.world_size = 2;
  spec.master_addr = "127.0.0.1";
  spec.master_port = 1234;
  auto env = [](const char* key) -> std::optional<std::string> {
    if (std::string(key) == "GRADWIRE_HOST_ID") return "from-env";
    return std::nullopt;
  };
  CHECK(gw::cluster::tcp_options(spec, env).host_id == "from-env");
}

TEST_CASE("exchange_topology over a store of one's own (concepts::rendezvous_store) gives every rank the topology the TCP store gives",
          "[cluster][topology][rendezvous]") {
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  gw::test::random_engine random(seed);
  for (const int n : {1, 2, 3, 5, 8, 13}) {
    CAPTURE(n);
    // Each rank on one of a few hosts at random; its display name says which.
    const int hosts = random.integer(1, n);
    std::vector<std::string> identities, names;
    for (int r = 0; r < n; ++r) {
      const int h = random.integer(0, hosts - 1);
      identities.push_back("host" + std::to_string(h) + "/boot/1");
      names.push_back("10.0.0." + std::to_string(h));
    }
    // The reference, serially: hosts numbered by first appearance, each named by its lowest rank.
    std::vector<int> expected_host(static_cast<std::size_t>(n));
    std::vector<std::string> expected_name;
    std::map<std::string, int> seen;
    for (int r = 0; r < n; ++r) {
      const auto [it, fresh] = seen.try_emplace(identities[r], static_cast<int>(seen.size()));
      if (fresh) expected_name.push_back(names[r]);
      expected_host[r] = it->second;
    }
    auto run = [&](auto make_store) {
      std::vector<topology> got(static_cast<std::size_t>(n));
      on_threads(n, [&](int rank) {
        auto store = make_store(rank);
        got[rank] = gw::rendezvous::exchange_topology(*store, "test/host/", rank, n, identities[rank], names[rank], 30s);
      });
      return got;
    };
    memory_store::shared memory;
    const auto mine = run([&](int) { return std::make_unique<memory_store>(memory); });
    const gw::rendezvous::store_server server("127.0.0.1", 0, "exchange-test");
    const auto tcp = run([&](int) {
      return std::make_unique<gw::rendezvous::store_client>("127.0.0.1", server.port(), "exchange-test", 30s);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const topology& t = mine[static_cast<std::size_t>(r)];
      REQUIRE(t.size() == n);
      REQUIRE(t.host_count() == static_cast<int>(expected_name.size()));
      for (int q = 0; q < n; ++q) REQUIRE(t.host(q) == expected_host[q]);
      for (int h = 0; h < t.host_count(); ++h) REQUIRE(t.host_name(h) == expected_name[h]);
      REQUIRE(t.to_string() == tcp[static_cast<std::size_t>(r)].to_string());
    }
  }
}

TEST_CASE("exchange_topology over a store of one's own names the rank that never published, when its get times out",
          "[cluster][topology][rendezvous]") {
  memory_store::shared memory;
  memory_store store(memory);
  const std::string mine = "host/0";
  store.set("test/host/0", std::as_bytes(std::span(mine.data(), mine.size())));  // rank 0 came; rank 1 never does
  REQUIRE_THROWS_MATCHES(
      gw::rendezvous::exchange_topology(store, "test/host/", 2, 3, "h", "h", 200ms), gw::error,
      gw::test::is_error(gw::errc::timeout, {"rank 2: rank 1 did not connect within 200 ms (it never published its host identity)"}));
}

TEST_CASE("asio_tcp exchanges host identities at join, and the communicator and any_transport report them",
          "[cluster][topology]") {
  const std::vector<std::string> hosts{"hostA", "hostB", "hostA", "hostB", "hostC"};
  const int n = static_cast<int>(hosts.size());
  const auto port = free_port();
  std::vector<std::vector<float>> results(hosts.size());
  on_threads(n, [&](int rank) {
    gw::transport::asio_tcp_options o;
    o.rank = rank;
    o.size = n;
    o.job_token = "topology-test";
    o.store_port = port;
    o.connect_timeout = 30s;
    o.host_id = hosts[static_cast<std::size_t>(rank)];
    gw::transport::asio_tcp t(o);
    const topology& seen = t.topology();
    if (seen.host_count() != 3 || seen.host(rank) != (rank == 4 ? 2 : rank % 2) || seen.local_size(rank) != (rank == 4 ? 1 : 2) ||
        seen.local_rank(rank) != (rank == 4 ? 0 : rank / 2) || seen.host_name(0) != "127.0.0.1")
      throw std::runtime_error("rank " + std::to_string(rank) + " saw " + seen.to_string());
    gw::collective::communicator comm(gw::transport::any_transport(std::move(t)), {.timeout = 30s});
    if (comm.host_count() != 3 || comm.local_size() != (rank == 4 ? 1 : 2))
      throw std::runtime_error("any_transport lost the topology: " + comm.topology().to_string());
    // And the hierarchical all-reduce runs over it between processes' worth of sockets.
    std::vector<float> v(100003);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(rank + 1) * float(i % 7);
    gw::collective::all_reduce<gw::collective::hierarchical>(comm, std::span<float>(v));
    results[static_cast<std::size_t>(rank)] = v;
  });
  for (std::size_t i = 0; i < results[0].size(); ++i) REQUIRE(results[0][i] == 15.0f * float(i % 7));
  for (int r = 1; r < n; ++r) REQUIRE(results[static_cast<std::size_t>(r)] == results[0]);
}

TEST_CASE("asio_tcp without GRADWIRE_HOST_ID puts threads of one process on one host", "[cluster][topology]") {
  const auto port = free_port();
  on_threads(3, [&](int rank) {
    gw::transport::asio_tcp_options o;
    o.rank = rank;
    o.size = 3;
    o.job_token = "topology-test-2";
    o.store_port = port;
    o.connect_timeout = 30s;
    gw::transport::asio_tcp t(o);
    if (t.topology().host_count() != 1 || t.topology().local_rank(rank) != rank)
      throw std::runtime_error("rank " + std::to_string(rank) + " saw " + t.topology().to_string());
  });
  SUCCEED();
}

TEST_CASE("asio_tcp ranks listening on IPv6 reach each other through the bracketed addresses they publish",
          "[cluster][topology]") {
  {  // A kernel without IPv6 (disable_ipv6) cannot run this job at all.
    boost::asio::io_context io;
    boost::system::error_code ec;
    boost::asio::ip::tcp::acceptor probe(io);
    probe.open(boost::asio::ip::tcp::v6(), ec);
    if (!ec) probe.bind({boost::asio::ip::make_address("::1"), 0}, ec);
    if (ec) {
      WARN("no IPv6 loopback here (" << ec.message() << "): not run");
      return;
    }
  }
  const auto port = free_port();
  constexpr int n = 3;
  std::vector<std::vector<float>> results(n);
  on_threads(n, [&](int rank) {
    gw::transport::asio_tcp_options o;
    o.rank = rank;
    o.size = n;
    o.job_token = "topology-test-v6";
    o.store_port = port;  // the store stays on 127.0.0.1; the ranks' own links are IPv6
    o.connect_timeout = 30s;
    o.listen_host = "::1";
    gw::transport::asio_tcp t(o);
    if (t.topology().host_name(0) != "::1")
      throw std::runtime_error("rank " + std::to_string(rank) + " saw " + t.topology().to_string());
    gw::collective::communicator comm(std::move(t), {.timeout = 30s});
    std::vector<float> v(1000, float(rank + 1));
    gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
    results[static_cast<std::size_t>(rank)] = v;
  });
  for (const auto& v : results) REQUIRE(v == std::vector<float>(1000, 6.0f));
}
