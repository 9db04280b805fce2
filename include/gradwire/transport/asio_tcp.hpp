// Boost.Asio TCP transport: one connection per pair of ranks, tagged messages in wire frames, deadlines everywhere.
//
// Progress is made by the thread that waits: wait() runs the rank's io_context until
// its request completes or its deadline passes, so a message costs no hand-off between
// threads and an idle rank sleeps in epoll. A rank's endpoint is used by one thread at a
// time (the collectives' background thread, or the caller).
//
// Messages move without staging copies where the order of events allows: a send
// writes the frame header and the caller's buffer with one gathered write. Each
// connection reads what has arrived into a 64 KiB frame buffer, one read for all the
// frames in it, and small messages are copied from there; the rest of a large message
// whose receive is posted is read straight into the caller's buffer. A large
// message that arrives first is buffered if it is not too large (eager, up to eager_bytes);
// of a large one, the head (early_bytes) is read ahead into the link's early buffer and
// the rest stays in the kernel until its receive is posted, then goes straight into
// place. Later messages on that connection wait behind it. Reads and writes move as
// much per system call as the kernel takes (docs/perf/tcp.md).
//
// A connection that breaks (the peer exited or was killed), a frame that does not
// parse, or an abort frame from a peer that failed fails every pending and future
// operation of the rank with peer_lost (or the peer's own error kind) naming the rank
// that was lost, so a job stops as a whole instead of waiting for its deadlines.
//
// The class is the shared facade (detail/network_facade.hpp) over tcp_engine; the engine
// lives in tcp/, one file per job: join, rejoin, send, receive, wait, failure, watch (*.ipp:
// compiled once in src/asio.cpp, or here in header-only mode; see config.hpp).
#pragma once

#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "detail/deliver.hpp"
#include "detail/network_facade.hpp"
#include "tcp/engine.hpp"
#include "tcp/options.hpp"
#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/asio.cpp (config.hpp)
#include "tcp/control.ipp"
#include "tcp/failure.ipp"
#include "tcp/join.ipp"
#include "tcp/receive.ipp"
#include "tcp/rejoin.ipp"
#include "tcp/send.ipp"
#include "tcp/wait.ipp"
#include "tcp/watch.ipp"
#endif

namespace gradwire::transport {

class asio_tcp : public detail::network_facade<detail::tcp_engine> {
 public:
  // Joins the job: rank 0 starts the rendezvous store, every rank listens, publishes
  // its address, and connects to every other rank (the higher rank of a pair dials).
  // Collective: every rank of the job calls it with the same size and token. Hosts in
  // topology() are shown by the address they listen on.
  explicit asio_tcp(const asio_tcp_options& options) : network_facade(options) {}

  // Receives inout.size() elements and adds them into inout as they arrive, chunk by
  // chunk, so the reduction overlaps the transfer and needs no full-size staging.
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    traffic_.received(inout.size_bytes());
    auto op = engine_->make_op(false, peer, tag, reinterpret_cast<std::byte*>(inout.data()), inout.size_bytes());
    op->deliver = &detail::deliver_accumulate<V>;
    return detail::start_operation(engine_, std::move(op), [&](detail::tcp_op& o) { engine_->post_recv(o); });
  }
};

static_assert(concepts::transport<asio_tcp> && concepts::failable_transport<asio_tcp>);
static_assert(concepts::multiplexing_transport<asio_tcp> && concepts::loss_tolerant_transport<asio_tcp>);
static_assert(concepts::rejoinable_transport<asio_tcp>);
static_assert(concepts::accumulating_transport<asio_tcp, float> && concepts::accumulating_transport<asio_tcp, double>);
static_assert(concepts::metered_transport<asio_tcp>);
static_assert(concepts::topology_aware_transport<asio_tcp>);

}  // namespace gradwire::transport
