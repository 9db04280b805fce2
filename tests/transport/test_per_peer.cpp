// per_peer<Intra, Inter> over threads: routing by host, forwarded capabilities, collectives against float64; lost peers in job ranks.
#include <catch2/catch.hpp>

#include <chrono>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/transport/inproc.hpp>
#include <gradwire/transport/per_peer.hpp>
#include <memory>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;
namespace col = gradwire::collective;
using gw::transport::inproc;
using pair_type = gw::transport::per_peer<inproc, inproc>;
using namespace std::chrono_literals;

// Both parts have every capability, so the pair has them all (and inproc's fused add).
static_assert(gw::concepts::transport<pair_type> && gw::concepts::multiplexing_transport<pair_type>);
static_assert(gw::concepts::failable_transport<pair_type> && gw::concepts::metered_transport<pair_type>);
static_assert(gw::concepts::accumulating_transport<pair_type, float> &&
              gw::concepts::accumulating_transport<pair_type, double>);
static_assert(gw::concepts::topology_aware_transport<pair_type>);

namespace {
// Runs fn(per_peer) on one thread per rank of `hosts`: Inter spans every rank, Intra each host's.
template <class Fn>
void run_on(const gw::cluster::topology& hosts, Fn fn) {
  gw::transport::inproc_group inter(hosts.size());
  std::vector<std::unique_ptr<gw::transport::inproc_group>> intra;
  for (int h = 0; h < hosts.host_count(); ++h)
    intra.push_back(std::make_unique<gw::transport::inproc_group>(static_cast<int>(hosts.ranks_on(h).size())));
  auto outcomes = inter.run([&](inproc t) {
    const int me = t.rank();
    pair_type p(intra[static_cast<std::size_t>(hosts.host(me))]->endpoint(hosts.local_rank(me)), std::move(t), hosts);
    fn(p);
  });
  for (auto& e : outcomes)
    if (e) std::rethrow_exception(e);
}

double input(int rank, std::size_t i) { return (rank + 1) * 0.5 + double(i % 97); }
}  // namespace

TEST_CASE("per_peer routes each peer to Intra on its host and Inter elsewhere, by local rank") {
  const gw::cluster::topology hosts(std::vector<int>{0, 1, 1, 0, 1});  // non-contiguous, uneven
  run_on(hosts, [&](pair_type& p) {
    const int me = p.rank(), n = p.size();
    const auto until = gw::clock::now() + 10s;
    std::vector<int> got(static_cast<std::size_t>(n), -1);
    std::vector<int> mine{me};
    std::vector<pair_type::request> ops;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      ops.push_back(p.async_send(r, 3, std::as_bytes(std::span(mine))));
      ops.push_back(p.async_recv(r, 3, std::as_writable_bytes(std::span(&got[static_cast<std::size_t>(r)], 1))));
    }
    for (auto& o : ops) {
      REQUIRE(o);
      p.wait(o, until);
      REQUIRE_FALSE(o);
    }
    for (int r = 0; r < n; ++r)
      if (r != me) REQUIRE(got[static_cast<std::size_t>(r)] == r);
    const int local_peers = hosts.local_size(me) - 1, remote_peers = n - 1 - local_peers;
    REQUIRE(p.intra().traffic().messages_sent == static_cast<std::uint64_t>(local_peers));
    REQUIRE(p.inter().traffic().messages_sent == static_cast<std::uint64_t>(remote_peers));
    REQUIRE(p.traffic().messages_sent == static_cast<std::uint64_t>(n - 1));
  });
}

TEST_CASE("per_peer wait_any finds a completed request among both transports' requests") {
  const gw::cluster::topology hosts(std::vector<int>{0, 0, 1});
  run_on(hosts, [&](pair_type& p) {
    const auto until = gw::clock::now() + 10s;
    std::vector<int> a(1), b(1), one{1}, two{2};
    if (p.rank() == 0) {
      auto from_local = p.async_recv(1, 9, std::as_writable_bytes(std::span(a)));
      auto from_remote = p.async_recv(2, 9, std::as_writable_bytes(std::span(b)));
      pair_type::request* both[] = {&from_local, &from_remote};
      std::size_t first = p.wait_any(both, until);
      p.wait(*both[first], until);
      const std::size_t second = 1 - first;
      REQUIRE(p.wait_any(std::span(both).subspan(second, 1), until) == 0);
      p.wait(*both[second], until);
      REQUIRE(a[0] == 1);
      REQUIRE(b[0] == 2);
    } else {
      auto s = p.async_send(0, 9, std::as_bytes(std::span(p.rank() == 1 ? one : two)));
      p.wait(s, until);
    }
  });
}

TEST_CASE("per_peer carries ring and hierarchical all-reduce and broadcast on uneven hosts") {
  for (const auto& labels : {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 1, 2, 2, 2}, std::vector<int>{0, 1, 0, 1, 0}}) {
    const gw::cluster::topology hosts(labels);
    run_on(hosts, [&](pair_type& p) {
      col::communicator<pair_type> comm(std::move(p), {.timeout = std::chrono::seconds(30)});
      const int n = comm.size(), me = comm.rank();
      REQUIRE(comm.host_count() == hosts.host_count());
      for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{65537}}) {
        std::vector<float> ring(count), hier(count);
        for (std::size_t i = 0; i < count; ++i) ring[i] = hier[i] = static_cast<float>(input(me, i));
        col::all_reduce<col::ring>(comm, std::span<float>(ring));
        col::all_reduce<col::hierarchical>(comm, std::span<float>(hier));
        for (std::size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += static_cast<float>(input(r, i));
          REQUIRE(ring[i] == Approx(want).epsilon(1e-6));
          REQUIRE(hier[i] == Approx(want).epsilon(1e-6));
        }
      }
      std::vector<double> b(33, me == n - 1 ? 7.25 : 0.0);
      col::broadcast(comm, std::span<double>(b), n - 1);
      for (double x : b) REQUIRE(x == 7.25);
    });
  }
}

TEST_CASE("per_peer refuses an Intra that does not span this rank's host") {
  const gw::cluster::topology hosts(std::vector<int>{0, 0, 1});
  gw::transport::inproc_group inter(3), wrong(3);
  // Rank 0 is local rank 0 of 2 on host 0, but its Intra is rank 0 of 3: a config error.
  const auto [kind, what] = gw::testing::error_of([&] { pair_type(wrong.endpoint(0), inter.endpoint(0), hosts); });
  REQUIRE(kind == gw::errc::config);
  REQUIRE_THAT(what, Catch::Contains("per_peer: rank 0 is local rank 0 of 2 on its host, but its shared-memory "
                                     "transport is rank 0 of 3: join it among the host's ranks only"));
  // The right size, numbered otherwise than by local rank, either way round: refused too.
  gw::transport::inproc_group host0(2);
  for (const auto& [rank, intra_rank] : {std::pair{1, 0}, std::pair{0, 1}}) {
    CAPTURE(rank, intra_rank);
    const auto [k, w] = gw::testing::error_of([&] { pair_type(host0.endpoint(intra_rank), inter.endpoint(rank), hosts); });
    REQUIRE(k == gw::errc::config);
    REQUIRE_THAT(w, Catch::Contains("per_peer: rank " + std::to_string(rank) + " is local rank " + std::to_string(rank) +
                                    " of 2 on its host, but its shared-memory transport is rank " +
                                    std::to_string(intra_rank) + " of 2"));
  }
}

// --- lost peers: named by the job's rank, whichever part lost them --------------------

namespace {
// A part that only records: what tolerate_loss was told, and which peers (in its own
// numbering) lost_peers() reports. Its messages complete at once; nothing here sends any.
// Why not two real transports: which part notices a loss first is a race between them, and
// this checks per_peer's own arithmetic (its parts' numbering to the job's), every rank and
// every peer, deterministically; the parts' own loss reports are tested with each transport.
class recording_part {
 public:
  struct request {
    explicit operator bool() const noexcept { return false; }
  };
  recording_part(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  request async_send(int, std::uint64_t, std::span<const std::byte>) { return {}; }
  request async_recv(int, std::uint64_t, std::span<std::byte>) { return {}; }
  void wait(request&, gw::deadline) {}
  std::size_t wait_any(std::span<request* const>, gw::deadline) { return 0; }
  void tolerate_loss(int peer) { tolerated.push_back(peer); }
  std::vector<int> lost_peers() const { return lost; }

  std::vector<int> tolerated, lost;  // in this part's numbering

 private:
  int rank_, size_;
};
using recording_pair = gw::transport::per_peer<recording_part, recording_part>;
static_assert(gw::concepts::loss_tolerant_transport<recording_pair>);
// Whether it can lose a peer depends on both parts, so it says at run time.
static_assert(gw::concepts::conditionally_loss_tolerant_transport<recording_pair>);

recording_pair pair_for(const gw::cluster::topology& hosts, int me) {
  return {recording_part(hosts.local_rank(me), hosts.local_size(me)), recording_part(me, hosts.size()), hosts};
}
}  // namespace

TEST_CASE("per_peer names a lost peer by its rank in the job, whether shared memory or the network lost it") {
  // Host 0: ranks 0, 3, 5; host 1: ranks 1, 2, 4. Every rank of host 1 has a local rank
  // that differs from its job rank, and so do ranks 3 and 5 of host 0: a lost peer named
  // by Intra's numbering (or by the other host's) comes out as another rank.
  const gw::cluster::topology hosts(std::vector<int>{0, 1, 1, 0, 1, 0});
  const int n = hosts.size();
  for (int me = 0; me < n; ++me) {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      CAPTURE(me, peer);
      recording_pair p = pair_for(hosts, me);
      if (p.is_local(peer))
        p.intra().lost = {hosts.local_rank(peer)};  // Intra numbers the host's ranks by local rank
      else
        p.inter().lost = {peer};
      CHECK(p.lost_peers() == std::vector<int>{peer});
    }
    // Every peer lost at once, through both parts: each named once, in the job's ranks, sorted.
    CAPTURE(me);
    recording_pair p = pair_for(hosts, me);
    std::vector<int> others;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      others.push_back(peer);
      if (p.is_local(peer))
        p.intra().lost.push_back(hosts.local_rank(peer));
      else
        p.inter().lost.push_back(peer);
    }
    CHECK(p.lost_peers() == others);
  }
  // Spelled out for rank 4 (host 1, local rank 2): Intra's local ranks 0 and 1 are job
  // ranks 1 and 2; Inter's 3 and 5 are themselves.
  recording_pair p = pair_for(hosts, 4);
  p.intra().lost = {1, 0};
  p.inter().lost = {5, 3};
  CHECK(p.lost_peers() == std::vector<int>{1, 2, 3, 5});
}

TEST_CASE("per_peer tolerates the loss of a peer in the part that reaches it, under that part's number for it") {
  const gw::cluster::topology hosts(std::vector<int>{0, 1, 1, 0, 1, 0});
  recording_pair on_host1 = pair_for(hosts, 4);  // local rank 2 of ranks 1, 2, 4
  for (int peer : {0, 1, 2, 3, 5}) on_host1.tolerate_loss(peer);
  CHECK(on_host1.intra().tolerated == std::vector<int>{0, 1});  // ranks 1 and 2
  CHECK(on_host1.inter().tolerated == std::vector<int>{0, 3, 5});
  recording_pair on_host0 = pair_for(hosts, 5);  // local rank 2 of ranks 0, 3, 5
  for (int peer : {4, 3, 2, 1, 0}) on_host0.tolerate_loss(peer);
  CHECK(on_host0.intra().tolerated == std::vector<int>{1, 0});  // ranks 3 and 0
  CHECK(on_host0.inter().tolerated == std::vector<int>{4, 2, 1});
  // What it tolerated, lost: reported back under the same job ranks.
  on_host0.intra().lost = on_host0.intra().tolerated;
  on_host0.inter().lost = on_host0.inter().tolerated;
  CHECK(on_host0.lost_peers() == std::vector<int>{0, 1, 2, 3, 4});
}
