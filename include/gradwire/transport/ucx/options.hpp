// How a rank joins a job over UCX (ucx_options): the store, timeouts, polling, heartbeats, endpoints, one-sided use.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../../timeouts.hpp"

namespace gradwire::transport {

// How a rank joins a job over UCX. cluster::ucx_options() fills it from a cluster_spec.
struct ucx_options {
  int rank = 0;
  int size = 1;
  std::string job_token;  // the rendezvous store refuses ranks of other jobs
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 0;
  // Rank 0 serves the store unless another transport of the job already does (per_peer
  // joins UCX among one host's ranks through the store its network transport serves),
  // and the ranks publish their addresses under this key prefix (one per such group).
  bool serve_store = true;
  std::string store_prefix = "gradwire/ucx/";
  // Joining (store, address exchange, endpoints) must finish within this.
  std::chrono::milliseconds connect_timeout = default_timeout;
  // This process replaces a rank that was lost (GRADWIRE_REJOIN=1; ucx/rejoin.ipp): it
  // reads every peer's latest address from the store and says hello to each; peers that
  // take it back (allow_rejoin) connect to it, the others refuse and stay unlinked
  // (operations with them fail with peer_lost). Rank 0 cannot rejoin: it serves the store.
  bool rejoin = false;
  // This rank's host identity, which tells the ranks that share its host (topology());
  // empty: GRADWIRE_HOST_ID, else hostname, boot id and network namespace
  // (rendezvous::local_host_identity says why).
  std::string host_id;
  // Ranks of this job on this machine: polling before sleeping only pays when each can
  // have a core (oversubscribed ranks would starve each other), as for asio_tcp.
  int local_size = 1;
  std::chrono::microseconds poll_before_sleep{50};
  // How often a sleeping wait wakes to run UCX's keepalive (peer failure detection).
  std::chrono::milliseconds keepalive_wake{100};
  // Heartbeats (timeouts.hpp; GRADWIRE_HEARTBEAT): UCX's keepalive interval, and TCP
  // keepalive on UCX's TCP sockets (UCX_TCP_KEEPIDLE = KEEPINTVL = the interval, KEEPCNT =
  // heartbeat_misses), unless UCX_* variables say otherwise. 0 s: UCX's keepalive every
  // second (it also finds dead peers over shared memory), TCP keepalive as UCX sets it.
  // This covers idle links only: a link with data in flight to a host that was cut off
  // retransmits for many minutes (checked across emulated hosts: no failure within 40 s),
  // and TCP_USER_TIMEOUT, which would end that, also ends the connection to a stopped
  // peer that is alive. So over UCX such a partition is found at the operation deadline
  // (GRADWIRE_STEP_TIMEOUT); asio_tcp reads TCP_INFO itself and finds it in 5 s.
  std::chrono::seconds heartbeat_interval = default_heartbeat_interval;
  int heartbeat_misses = default_heartbeat_misses;
  // A wait that lasts stall_warn logs once which rank it waits for (GRADWIRE_STALL_WARN;
  // unlike asio_tcp, without the chain of waits behind it); with stall_timeout > 0 the
  // wait fails with timeout after that long, naming that rank, and tells the peers why
  // (GRADWIRE_STALL_TIMEOUT).
  std::chrono::milliseconds stall_warn = default_stall_warn;
  std::chrono::milliseconds stall_timeout = default_stall_timeout;
  // Endpoints with UCX's peer error handling: a dead peer becomes peer_lost within about
  // a second. Off: a dead peer is noticed only through deadlines (timeout).
  bool peer_error_handling = true;
  // UCX 1.13 leaves out of error-handling endpoints the transports that cannot report a
  // peer's failure, CMA among them: shared memory's single-copy rendezvous. Messages of
  // at least this many bytes therefore travel on a second endpoint per peer, without
  // error handling, where UCX may use CMA; the first endpoint still watches the peer
  // (keepalive), and its failure fails both. 0: one endpoint for everything.
  std::size_t bulk_bytes = std::size_t{256} << 10;
  // One-sided access (expose / attach / async_put / async_get), which the parameter
  // server takes for push and pull to the peers prefers_one_sided() names:
  //   automatic  peers on this machine when shared memory is allowed (single-copy CMA;
  //              measured 1.1-1.7x faster than tagged messages), none over TCP (UCX
  //              emulates RMA there; 1.6-5.8x slower);
  //   always     every peer: RDMA fabrics (rc, dc), where put and get are native;
  //   never      tagged messages only.
  enum class one_sided_use { automatic, always, never } one_sided = one_sided_use::automatic;
};

}  // namespace gradwire::transport
