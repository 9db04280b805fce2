// The public face every network transport shares: messages, waits with deadlines, peer loss, failure, traffic.
//
// asio_tcp, ucx and mpi derive from network_facade<their engine> and add what only they
// do (asio_tcp: async_recv_accumulate; ucx: one-sided access; mpi: its communicator). The
// engine is shared with the requests (a request withdraws its op through it when dropped),
// so it lives behind a shared_ptr; the calls below go straight to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../../error.hpp"
#include "../../support/topology.hpp"
#include "../../timeouts.hpp"
#include "../traffic.hpp"
#include "failure.hpp"
#include "pending_request.hpp"

namespace gradwire::transport::detail {

// What an engine may lack: going on without a lost peer (tolerate(peer)), and a goodbye
// (say_goodbye()). asio_tcp's and ucx's have both; mpi's neither, as a lost rank ends an
// MPI job: its facade then has no tolerate_loss/lost_peers and sends nothing when destroyed.
template <class Engine>
concept loss_tolerant_engine = requires(Engine& e, int peer) { e.tolerate(peer); };
template <class Engine>
concept engine_says_goodbye = requires(Engine& e) { e.say_goodbye(); };

// Engine: a network_engine (network_engine.hpp) with join(), post_send, post_recv and
// abort_all(cause, reason), and maybe tolerate(peer) and say_goodbye() (above).
template <class Engine>
class network_facade {
 public:
  using request = pending_request<Engine, typename Engine::op_type>;

  int rank() const noexcept { return engine_->options.rank; }
  int size() const noexcept { return engine_->options.size; }
  // Which ranks share a host, from the host identities exchanged at join
  // (concepts::topology_aware_transport).
  const cluster::topology& topology() const noexcept { return engine_->topology; }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    return start_operation(engine_, engine_->make_op(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size()),
                           [&](typename Engine::op_type& op) { engine_->post_send(op); });
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    return start_operation(engine_, engine_->make_op(false, peer, tag, bytes.data(), bytes.size()),
                           [&](typename Engine::op_type& op) { engine_->post_recv(op); });
  }
  void wait(request& r, deadline until) { finish_operation(*engine_, r, until, Engine::name); }

  // Waits until one of `requests` can be waited for without blocking (its operation
  // has completed, successfully or not) and returns its index; it does not finish that
  // request: wait() on it then returns or throws at once. Empty requests are skipped.
  // Throws errc::timeout when none completes by `until`, and the rank's failure if it failed.
  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    return engine_->wait_any(requests, until);
  }

  // Losing `peer` (its connection breaks, or it aborts) fails only the operations that
  // involve it, now and later, instead of the whole rank; lost_peers() lists such peers.
  // For roles that outlive a peer, e.g. a parameter server that drops a dead worker.
  void tolerate_loss(int peer)
    requires loss_tolerant_engine<Engine>
  {
    if (peer < 0 || peer >= size() || peer == rank())
      throw error(errc::invalid_argument,
                  std::string(Engine::name) + "::tolerate_loss: rank " + std::to_string(peer) + " is not a peer");
    engine_->tolerate(peer);
  }
  std::vector<int> lost_peers() const
    requires loss_tolerant_engine<Engine>
  {
    return engine_->lost;
  }
  // Of the lost peers, those whose process is gone for sure (concepts::certain_loss_transport).
  std::vector<int> gone_peers() const
    requires loss_tolerant_engine<Engine>
  {
    return engine_->gone;
  }

  // After losing `peer` (tolerated), take back a process that replaces it: receives
  // posted from it meanwhile wait for the replacement (concepts::rejoinable_transport).
  void allow_rejoin(int peer)
    requires requires(Engine& e) { e.allow_rejoin(0); }
  {
    tolerate_loss(peer);
    engine_->allow_rejoin(peer);
  }
  // Whether this process replaces a lost rank (it joined with options.rejoin): it must not
  // take part in collectives that the others ran at the start.
  bool rejoined() const
    requires requires(const Engine& e) { e.options.rejoin; }
  {
    return engine_->options.rejoin;
  }
  // Peers whose replacements were taken back so far.
  int rejoined_peers() const
    requires requires(const Engine& e) { e.rejoined_peers; }
  {
    return engine_->rejoined_peers;
  }

  // Payload this rank has sent and received (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

  // Marks this rank failed and tells every peer why (best effort, within a second), so
  // they fail with this reason instead of a bare lost connection. Used when a rank
  // detects a disagreement (collective mismatch) that its peers cannot see.
  void fail(errc cause, const std::string& reason) { engine_->abort_all(cause, reason); }

 protected:
  // Joins the job (collective: every rank of the job calls it with the same size and token).
  template <class Options>
  explicit network_facade(const Options& options) : engine_(std::make_shared<Engine>(options)) {
    engine_->join();
  }
  network_facade(network_facade&&) noexcept = default;
  network_facade& operator=(network_facade&&) noexcept = default;
  // Says goodbye to every peer (engine_says_goodbye), so that they can tell a rank that
  // finished from one that crashed; while an exception unwinds, says why it failed instead
  // (an abort).
  ~network_facade() {
    if (!engine_) return;
    if (std::uncaught_exceptions() > 0)
      engine_->abort_all(errc::peer_lost, unwinding_reason);
    else if constexpr (engine_says_goodbye<Engine>)
      engine_->say_goodbye();
  }

  std::shared_ptr<Engine> engine_;
  traffic_counters traffic_;
};

}  // namespace gradwire::transport::detail
