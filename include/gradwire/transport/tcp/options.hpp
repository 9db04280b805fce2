// How a rank joins a job over TCP (asio_tcp_options): addresses, timeouts, buffering, heartbeats and stall times.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../../timeouts.hpp"

namespace gradwire::transport {

// How a rank joins a job over TCP. cluster::tcp_options() fills it from a cluster_spec.
struct asio_tcp_options {
  int rank = 0;
  int size = 1;
  std::string job_token;  // every rank of a job must give the same; frames of other jobs are refused
  // The rendezvous store (rank 0 serves it here; the others connect to it).
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 0;
  // Where this rank accepts its peers' connections; loopback unless told otherwise.
  // Empty: the address this rank reaches the store from (for jobs across machines).
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 0;  // 0: any free port (published through the store)
  // The whole join (store, listening, connecting to every peer) must finish within this.
  std::chrono::milliseconds connect_timeout = default_timeout;
  // Unmatched messages up to this size are buffered on arrival (so are any of at most
  // 16 KiB, and any that one read of the 64 KiB frame buffer took whole). Of a larger
  // one, the first early_bytes are read ahead into the link's early buffer (allocated and
  // pre-faulted once per link, at least 64 KiB: the part of a frame that the frame
  // buffer read goes there too), so the sender's writes go on while its receive is not
  // yet posted; the rest waits in the kernel until it is, then goes straight into place.
  std::size_t eager_bytes = std::size_t{256} << 10;
  std::size_t early_bytes = std::size_t{1} << 20;
  // Accumulating receives (async_recv_accumulate) read through a per-link stage in
  // chunks of this size and add each chunk as it lands, so the add overlaps the
  // transfer and the stage stays in cache (see docs/perf/tcp.md for how it was chosen).
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // CRC-32C over every payload as well as every header (TCP checksums segments already).
  bool checksum_payload = false;
  // Ranks of this job on this machine: a wait polls briefly before it sleeps in epoll
  // only when each of them can have a core (oversubscribed ranks would starve each other).
  int local_size = 1;
  // How long a wait polls before sleeping in epoll (with a core per rank; a quarter of
  // it, yielding between polls, when oversubscribed): a peer's answer often comes within
  // microseconds, and a sleep and wake-up cost more (measured on the 2-core development
  // VM: 4-byte ping-pong 45 -> 20 us, 4-byte all-reduce 57 -> 40 us). 0: sleep at once.
  std::chrono::microseconds poll_before_sleep{50};
  // Socket buffer sizes (SO_SNDBUF / SO_RCVBUF); 0 leaves the kernel's autotuning on.
  int socket_buffer_bytes = 0;
  // This rank's host identity, which tells the ranks that share its host (topology());
  // empty: GRADWIRE_HOST_ID, else hostname, boot id and network namespace
  // (rendezvous::local_host_identity says why).
  std::string host_id;
  // Failure detection (defaults and reasons in timeouts.hpp). Heartbeats: TCP keepalive
  // probes every interval on an idle link; a peer whose host answers nothing for
  // heartbeat_misses intervals is lost (peer_lost). 0 s: off.
  std::chrono::seconds heartbeat_interval = default_heartbeat_interval;
  int heartbeat_misses = default_heartbeat_misses;
  // A wait that lasts stall_warn logs once which rank it waits for and where the chain of
  // waits ends; with stall_timeout > 0 the wait fails with timeout after that long.
  std::chrono::milliseconds stall_warn = default_stall_warn;
  std::chrono::milliseconds stall_timeout = default_stall_timeout;
  // This process replaces a rank that was lost (a worker restarted after a crash; see
  // docs/reliability.md, "Workers that come back"): it does not serve the store, and it
  // dials every peer; peers that take it back (allow_rejoin) link it, the others refuse
  // and stay unlinked (operations with them fail with peer_lost). Rank 0 cannot rejoin:
  // it serves the rendezvous store.
  bool rejoin = false;
};

}  // namespace gradwire::transport
