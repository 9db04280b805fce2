// asio_tcp's op and link: one connection to a peer, with its reading and writing state and what it queues.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../support/asio.hpp"
#include "../detail/deliver.hpp"
#include "../detail/network_op.hpp"
#include "../detail/peer_state.hpp"
#include "../wire.hpp"

namespace gradwire::transport::detail {

using support::tcp;

struct tcp_op : network_op {
  deliver_fn deliver = deliver_copy;  // receives: copy, or add (async_recv_accumulate)
  wire::header_bytes header{};        // sends: the frame header, written with the payload
  std::size_t sent = 0;               // sends: bytes of header + payload already written (send.hpp)
};

// What a peer said it waits for in its latest status frame (it has waited long).
struct peer_status {
  std::vector<int> waits_for;  // empty: it no longer waits
  std::uint64_t operation = 0;
  std::uint64_t step = 0;
  std::string activity;        // the collective's name, if any
};

// A message that arrived before its receive was posted (eager) or self-sent.
struct arrived_message {
  std::uint64_t tag = 0;
  std::vector<std::byte> payload;
};

// Completion condition for async_read/async_write: as many bytes per system call as the
// kernel takes. Asio's own transfer_all stops each call at 64 KiB, which cost one
// sendmsg/recvmsg (and often an epoll_wait) per 64 KiB: 526 sendmsg per 16 MiB
// all-reduce on 2 ranks (docs/perf/tcp.md).
inline std::size_t whole_message(const boost::system::error_code& ec, std::size_t) noexcept {
  return ec ? 0 : std::size_t{1} << 30;
}

struct tcp_link {
  explicit tcp_link(tcp::socket s, int p) : socket(std::move(s)), peer(p) {}
  tcp::socket socket;
  int peer;
  bool alive = true;
  peer_state state;         // finished, suspected, lost (tolerated or not)
  bool rejoinable = false;  // once lost, a process that replaces the peer may link again (allow_rejoin)
  // Reading side: frames are read through rx; bytes [rx_begin, rx_end) are not yet handled.
  std::vector<std::byte> rx;
  std::size_t rx_begin = 0, rx_end = 0;
  wire::frame_header incoming;                   // header of the frame being read
  tcp_op* reading = nullptr;                     // receive whose payload is being read into place
  std::optional<arrived_message> reading_eager;  // or: eager payload being read
  bool parked = false;                           // `incoming` is large and waits for its receive
  // Read-ahead of a parked message: its first early_filled bytes are in `early`; while
  // early_reading, a read into it is in flight (a receive posted then waits in `reading`).
  std::vector<std::byte> early;
  std::size_t early_filled = 0;
  bool early_reading = false;
  bool evict = false;  // when the read-ahead lands, take the whole message into memory (wait.hpp)
  std::deque<tcp_op*> receives;                  // posted, unmatched, in posting order
  std::deque<arrived_message> arrived;           // arrived, unmatched, in arrival order
  std::vector<std::byte> stage;                  // accumulating receives read through it in chunks (chunk_bytes)
  // Writing side: front() is being written when `writing`.
  std::deque<tcp_op*> sends;
  bool writing = false;
  // Failure detection: the peer's address (for messages), its latest status frame, and
  // this rank's own status frame to it (queued like a send; one at a time).
  std::string address;
  std::optional<peer_status> status;
  tcp_op status_out;
  std::vector<std::byte> status_bytes;
};

}  // namespace gradwire::transport::detail
