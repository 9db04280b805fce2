// What the parameter-server tests with standbys share (test_parameter_server.cpp, and
// test_parameter_server_compressed.cpp with a codec): the simulated transport as the test
// arranges replication (replication_watch), the job of two workers, two servers and two
// standbys that runs over it, and the check of every worker's trajectory.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <gradwire/transport/simulated.hpp>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "parameter_server_support.hpp"

namespace gradwire::test::parameter_server_support {

namespace sim = gradwire::simulation;

// What the serving ranks' endpoints did, recorded by replication_watch in the order the
// simulator ran it (one rank at a time, in virtual-time order): the latest version each
// standby acknowledged, and every reply with the version its rank's standby had
// acknowledged when it was sent.
struct replication_record {
  struct reply {
    int rank, worker;
    std::uint64_t version;  // of the parameters it carried
    std::uint64_t acked;    // acknowledged by the standby of the sender's shard by then
  };
  explicit replication_record(int servers) : acked(std::size_t(servers), 0) {}
  std::mutex m;
  std::vector<std::uint64_t> acked;  // [server index]
  std::vector<reply> replies;
};

// A serving rank killed by the test: its thread ends with this, which makes it a lost peer
// to the others, as a crashed process is.
struct killed_by_test : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// transport::simulated as the test arranges replication: a standby sends each
// acknowledgement `ack_delay` (virtual time) after it applied the update, and server rank
// `kill_rank` dies `kill_after` after it sent its first reply of version `kill_at`.
class replication_watch {
 public:
  using request = gw::transport::simulated::request;
  struct plan {
    int first_server = 0, servers = 1;
    sim::duration ack_delay{};
    int kill_rank = -1;
    std::uint64_t kill_at = 0;
    sim::duration kill_after{};
  };
  replication_watch(gw::transport::simulated t, replication_record* record, plan p)
      : t_(std::move(t)), record_(record), plan_(p) {}
  int rank() const noexcept { return t_.rank(); }
  int size() const noexcept { return t_.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    namespace ps = gw::ps::detail;
    const auto index = std::size_t((rank() - plan_.first_server) % plan_.servers);
    if (tag == ps::replica_ack_tag) {
      if (bytes.size() != sizeof(ps::replica_ack)) throw std::runtime_error("test: an acknowledgement of another size");
      ps::replica_ack ack;
      std::memcpy(&ack, bytes.data(), sizeof ack);
      sim::compute(plan_.ack_delay);
      std::lock_guard lock(record_->m);
      record_->acked[index] = std::max(record_->acked[index], ack.version);
    }
    auto sent = t_.async_send(peer, tag, bytes);
    if (tag == ps::reply_tag) {
      if (bytes.size() < sizeof(ps::reply_header)) throw std::runtime_error("test: a reply shorter than its header");
      ps::reply_header h;
      std::memcpy(&h, bytes.data(), sizeof h);
      {
        std::lock_guard lock(record_->m);
        record_->replies.push_back({rank(), peer, h.version, record_->acked[index]});
      }
      if (rank() == plan_.kill_rank && h.version == plan_.kill_at) {
        sim::compute(plan_.kill_after);
        throw killed_by_test("server rank " + std::to_string(rank()) + " killed by the test after answering version " +
                             std::to_string(h.version));
      }
    }
    return sent;
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) { return t_.async_recv(peer, tag, bytes); }
  void wait(request& r, gw::deadline until) { t_.wait(r, until); }
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until) { return t_.wait_any(requests, until); }
  void tolerate_loss(int peer) { t_.tolerate_loss(peer); }
  std::vector<int> lost_peers() const { return t_.lost_peers(); }

 private:
  gw::transport::simulated t_;
  replication_record* record_;
  plan plan_;
};
static_assert(gw::concepts::multiplexing_transport<replication_watch> &&
              gw::concepts::loss_tolerant_transport<replication_watch>);

struct standby_run {
  std::vector<std::vector<std::vector<double>>> after;  // [worker][step]: its parameters after the step
  std::vector<gw::ps::server_stats> stats;              // [serving rank - first server]
  std::vector<std::exception_ptr> outcomes;             // [rank]
};

// Two workers, two servers, two standbys: ranks 0-1, 2-3, 4-5, on two modelled hosts of
// three ranks. The workers share host 0 with server rank 2 (a reply reaches them in 2 us),
// whose standby rank 4 is on host 1, across a 10 Mbit/s link with 50 us of latency.
// compute=modelled: the clocks move by the messages and the plan's delays only. Plain SGD
// in double, synchronous.
// Codec: the workers' pushes go through it (none: aggregation::no_codec).
template <class Codec = gw::aggregation::no_codec>
standby_run run_with_standbys(double lr, const std::vector<std::vector<batch_data>>& data, replication_record& record,
                              replication_watch::plan plan, const Codec& codec = Codec()) {
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::sync, replication_watch, Codec>;
  constexpr int workers = 2, servers = 2;
  auto options = small_shards(servers);
  options.standby = true;
  plan.first_server = workers;
  plan.servers = servers;
  const auto m =
      sim::parse_cluster_model("hosts=2 ranks_per_host=3 bandwidth=10Mbit latency=50us compute=modelled");
  REQUIRE(m.size() == workers + 2 * servers);
  auto policy = [&](const gw::ps::options& o) {
    if constexpr (std::is_same_v<Codec, gw::aggregation::no_codec>)
      return typename S::aggregation_type(o);
    else
      return gw::aggregation::parameter_server<gw::ps::sync>(o).compress(codec);
  };
  standby_run run;
  run.after.resize(workers);
  run.stats.resize(2 * servers);
  sim::job job(m);
  run.outcomes = job.run([&](gw::transport::simulated t) {
    const int me = t.rank();
    S s(replication_watch(std::move(t), &record, plan), start_params<double>(me), gw::optim::sgd({.lr = lr}),
        policy(options));
    if (s.is_server()) {
      run.stats[std::size_t(me - workers)] = s.serve();
      return;
    }
    for (const auto& batches : data) {
      const auto p = s.parameters();
      s.step(model.gradients<double>(p[0].data(), p[1].data(), batches[std::size_t(me)]));
      run.after[std::size_t(me)].push_back(flat<double>(s.parameters()));
    }
  });
  return run;
}

inline void require_serial_trajectories(const standby_run& run, const std::vector<std::vector<double>>& want) {
  for (std::size_t w = 0; w < run.after.size(); ++w) {
    REQUIRE(run.after[w].size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      CAPTURE(w, k);
      require_close_to_largest(run.after[w][k], want[k]);
    }
  }
}

}  // namespace gradwire::test::parameter_server_support
