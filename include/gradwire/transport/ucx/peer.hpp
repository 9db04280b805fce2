// ucx's op and peer: what an operation carries while UCX holds it, and what this rank knows of each peer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../timeouts.hpp"
#include "../detail/network_op.hpp"
#include "../detail/peer_state.hpp"
#include "support.hpp"

namespace gradwire::transport::detail {

struct ucx_op : network_op {
  ucx_op() { state = status::active; }  // UCX holds it from its start: no queue of ours
  bool one_sided = false;   // a put or get (is_send: UCX cannot cancel it; closing the endpoint releases it)
  const char* what = "";    // a put or get: "put to" or "get from"
  void* request = nullptr;  // UCX's request while the operation is in flight

  void finish(errc e = {}, std::string why = {}) {
    if (state != status::active) return;  // the first outcome stands (e.g. a failure before UCX's own)
    network_op::finish(e, std::move(why));
  }
};

// abort_seen answers an abort: the aborting rank waits for it (briefly) before it goes
// on, so that its exit cannot overtake the abort (over TCP, it did in 11 of 390 mismatch
// runs; likely because a process that exits with unread bytes resets its connections).
// rejoin carries a replacement's worker address (ucx/rejoin.ipp); a peer answers it with
// rejoin_welcome, or rejoin_refused and why.
enum class ucx_control : std::uint32_t {
  goodbye = 1,
  abort = 2,
  abort_seen = 3,
  rejoin = 4,
  rejoin_welcome = 5,
  rejoin_refused = 6
};

struct ucx_peer {
  ucp_ep_h ep = nullptr;       // peer error handling; control messages and small messages
  ucp_ep_h bulk_ep = nullptr;  // without; messages, puts and gets of bulk_bytes or more (may be ep itself)
  std::vector<ucp_rkey_h> rkeys;  // attached windows of the peer (each unpacked on ep and, if another, bulk_ep)
  bool same_host = false;
  // Tagged sends below bulk_bytes to it go eagerly (copied through the shared-memory
  // FIFO, no handshake). UCX switches shared memory to rendezvous at 8 KiB, and each
  // rendezvous (ready-to-send, the receiver's get, its acknowledgement) needs both
  // ranks on a core in turn: with 4 ranks on 2 cores a 64 KiB all-reduce took 290 us
  // against 73 us eagerly (docs/perf/ucx_sm.md). UCP_OP_ATTR_FLAG_FAST_CMPL makes UCX
  // use its RNDV_SEND_NBR_THRESH (256 KiB) instead, for these sends only; bulk_bytes and
  // more keep the single-copy rendezvous (CMA) of the bulk endpoint. Only over shared
  // memory: over TCP (UCX's own threshold about 20 KiB) it was not measured.
  bool eager_below_bulk = false;
  bool saw_our_abort = false;  // answered this rank's abort (abort_seen)
  // A replacement of it may be taken back once it is lost (allow_rejoin): receives from it
  // wait for the replacement meanwhile.
  bool rejoinable = false;
  // This rank is a replacement: the peer's answer to its hello.
  enum class answer : std::uint8_t { none, welcome, refused } rejoin_answer = answer::none;
  std::string refusal;
  bool refusal_retryable = false;  // the peer may take it back if asked again (errc::timeout)
  peer_state state;             // live, finished, suspected, lost (tolerated or not)
  std::optional<deadline> drained_at;  // said goodbye: its receives still open then fail
};

}  // namespace gradwire::transport::detail
