// One rank of the per_peer test: ring all-reduces over per_peer<ucx, asio_tcp>, checked against float64, and the bytes each part carried.
//
//   per_peer_worker COUNT REPEATS
//
// Runs REPEATS ring all-reduces of COUNT floats (sum) and prints
//   "rank R: PASS host H of N local L/S intra_sent X inter_sent Y"
// so that tests/multiprocess/test_per_peer.py can check the routing: in a ring the ranks
// of a host pass data among themselves through shared memory (Intra) and only the last
// rank of each host sends to the next host (Inter); the harness compares Inter's bytes
// with what crossed each emulated host's link.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gradwire/cluster/per_peer.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/communicator.hpp>
#include <string>
#include <vector>

namespace gw = gradwire;
namespace col = gradwire::collective;
using per_peer = gw::transport::per_peer<gw::transport::ucx, gw::transport::asio_tcp>;
static_assert(gw::concepts::transport<per_peer> && gw::concepts::multiplexing_transport<per_peer>);
static_assert(gw::concepts::failable_transport<per_peer> && gw::concepts::metered_transport<per_peer>);
static_assert(gw::concepts::loss_tolerant_transport<per_peer> && gw::concepts::topology_aware_transport<per_peer>);

namespace {
// Rank r's element i: exact in float, so float64 sums of few ranks are exact too.
float input(int rank, std::size_t i, int repeat) { return static_cast<float>((rank + 1) * 0.25 + double(i % 1000) - repeat); }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: per_peer_worker COUNT REPEATS\n");
    return 2;
  }
  const std::size_t count = std::stoull(argv[1]);
  const int repeats = std::stoi(argv[2]);
  int me = -1;
  try {
    per_peer t = gw::cluster::join_per_peer();
    me = t.rank();
    const gw::cluster::topology hosts = t.topology();
    col::communicator<per_peer> comm(std::move(t), {.timeout = std::chrono::seconds(60)});
    const int n = comm.size();
    std::vector<float> data(count);
    for (int k = 0; k < repeats; ++k) {
      for (std::size_t i = 0; i < count; ++i) data[i] = input(me, i, k);
      col::barrier(comm);
      col::all_reduce<col::ring>(comm, std::span<float>(data));
      for (std::size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += input(r, i, k);
        if (data[i] != static_cast<float>(want)) {
          std::printf("rank %d: FAIL element %zu of repeat %d: %g, want %g\n", me, i, k, double(data[i]), want);
          return 1;
        }
      }
    }
    col::barrier(comm);
    per_peer& tr = comm.transport();
    std::printf("rank %d: PASS host %d of %d local %d/%d intra_sent %llu inter_sent %llu\n", me, hosts.host(me),
                hosts.host_count(), hosts.local_rank(me), hosts.local_size(me),
                static_cast<unsigned long long>(tr.intra().traffic().bytes_sent),
                static_cast<unsigned long long>(tr.inter().traffic().bytes_sent));
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", me, e.what());
    return 1;
  }
  return 0;
}
