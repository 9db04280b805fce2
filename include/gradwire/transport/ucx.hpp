// UCX transport: tagged messages over UCP (shared memory, TCP, RDMA: whatever UCX_TLS allows), deadlines everywhere.
//
// One UCP context and worker per rank. Ranks meet through the rendezvous store (rank 0
// serves it, as for asio_tcp): each publishes its worker address, then creates one
// endpoint per peer with peer error handling, so a peer that dies becomes peer_lost on
// the ranks that need it instead of a hang or an abort. UCX picks the wire (shared
// memory with a single-copy rendezvous through CMA between processes of one machine,
// TCP or RDMA between machines) from its own environment: UCX_TLS, UCX_NET_DEVICES, ...
//
// Progress is made by the thread that waits, as for asio_tcp: wait() drives the worker
// until its request completes, polling briefly and then sleeping on the worker's event
// fd (ucp_worker_arm), so an idle rank costs no core. It wakes at least every
// `keepalive_wake` to let UCX's keepalive notice peers that died without a word.
//
// The transport's own control messages (goodbye, abort with the reason) travel as tagged
// messages with the control bit set, so a rank tells a peer that finished from one that
// crashed, and reports the root cause of a failure that only one rank could see.
//
// The class is the shared facade (detail/network_facade.hpp) over ucx_engine; the engine
// lives in ucx/, one file per job: endpoints, rejoin, worker, send, receive, one_sided, control, failure
// (*.ipp: compiled once in src/ucx.cpp, or here in header-only mode; see config.hpp).
#pragma once

#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "detail/network_facade.hpp"
#include "ucx/engine.hpp"
#include "ucx/one_sided.hpp"
#include "ucx/options.hpp"
#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/ucx.cpp (config.hpp)
#include "ucx/control.ipp"
#include "ucx/failure.ipp"
#include "ucx/join.ipp"
#include "ucx/one_sided.ipp"
#include "ucx/receive.ipp"
#include "ucx/rejoin.ipp"
#include "ucx/send.ipp"
#include "ucx/wait.ipp"
#include "ucx/watch.ipp"
#include "ucx/worker.ipp"
#endif

namespace gradwire::transport {

class ucx : public detail::network_facade<detail::ucx_engine> {
 public:
  // Joins the job: rank 0 starts the rendezvous store, every rank publishes its UCP
  // worker address and creates an endpoint to every rank. Collective. Hosts in
  // topology() are shown by their identity. The destructor also flushes what this rank
  // sent before its goodbye, and closes its endpoints.
  explicit ucx(const ucx_options& options) : network_facade(options) {}

  // --- one-sided access (concepts::one_sided_transport) ------------------------------

  // Memory this rank lets its peers put into and get from (key(): what a peer passes to
  // attach()), and a peer's exposed memory, usable until destroyed or the peer is gone.
  using memory_window = detail::ucx_memory_window;
  using remote_window = detail::ucx_remote_window;

  memory_window expose(std::span<std::byte> memory) { return engine_->expose(engine_, memory); }
  remote_window attach(int peer, std::span<const std::byte> key) { return engine_->attach(engine_, peer, key); }

  // Writes `bytes` at `offset` of the peer's window; done once they are in its memory.
  request async_put(remote_window& to, std::size_t offset, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    auto op = engine_->make_one_sided_op(to, offset, const_cast<std::byte*>(bytes.data()), bytes.size(), "put to");
    return detail::start_operation(engine_, std::move(op), [&](detail::ucx_op& o) {
      engine_->post_one_sided(o, to, to.address_ + offset, true);
    });
  }
  // Reads `bytes.size()` bytes at `offset` of the peer's window into `bytes`.
  request async_get(remote_window& from, std::size_t offset, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    auto op = engine_->make_one_sided_op(from, offset, bytes.data(), bytes.size(), "get from");
    return detail::start_operation(engine_, std::move(op), [&](detail::ucx_op& o) {
      engine_->post_one_sided(o, from, from.address_ + offset, false);
    });
  }

  // Whether put and get beat tagged messages to `peer` (ucx_options::one_sided).
  bool prefers_one_sided(int peer) const {
    using use = ucx_options::one_sided_use;
    if (engine_->options.one_sided == use::never || peer < 0 || peer >= size()) return false;
    if (engine_->options.one_sided == use::always) return true;
    return engine_->peers[peer].same_host && detail::ucx_may_use_shared_memory();
  }
};

static_assert(concepts::transport<ucx> && concepts::failable_transport<ucx>);
static_assert(concepts::multiplexing_transport<ucx> && concepts::loss_tolerant_transport<ucx>);
static_assert(concepts::one_sided_transport<ucx> && concepts::metered_transport<ucx>);
static_assert(concepts::topology_aware_transport<ucx>);
static_assert(concepts::rejoinable_transport<ucx>);

}  // namespace gradwire::transport
