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
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/activity.hpp"
#include "../observe/log.hpp"
#include "../rendezvous/host_identity.hpp"
#include "../rendezvous/store.hpp"
#include "../support/topology.hpp"
#include "../timeouts.hpp"
#include "detail/messages.hpp"
#include "detail/pending_request.hpp"
#include "traffic.hpp"
#include "detail/ucx_support.hpp"

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
  // A wait that lasts this long logs once which rank it waits for (GRADWIRE_STALL_WARN;
  // unlike asio_tcp, without the chain of waits behind it, and without a stall timeout).
  std::chrono::milliseconds stall_warn = default_stall_warn;
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

namespace detail {

struct ucx_op {
  enum class status : std::uint8_t { active, done, cancelled };
  bool is_send = false;  // a send, put or get: UCX cannot cancel it (closing the endpoint releases it)
  bool one_sided = false;  // a put or get
  const char* what = "";   // a put or get: "put to" or "get from"
  int peer = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  void* request = nullptr;  // UCX's request while the operation is in flight
  status state = status::active;
  errc failure{};
  std::string message;

  void finish(errc e = {}, std::string why = {}) {
    if (state != status::active) return;  // the first outcome stands (e.g. a failure before UCX's own)
    state = status::done;
    failure = e;
    message = std::move(why);
  }
};

enum class ucx_control : std::uint32_t { goodbye = 1, abort = 2 };

struct ucx_peer {
  ucp_ep_h ep = nullptr;       // peer error handling; control messages and small messages
  ucp_ep_h bulk_ep = nullptr;  // without; messages, puts and gets of bulk_bytes or more (may be ep itself)
  std::vector<ucp_rkey_h> rkeys;  // attached windows of the peer (each unpacked on ep and, if another, bulk_ep)
  bool same_host = false;
  bool finished = false;   // said goodbye: nothing more will arrive from it
  bool tolerated = false;  // losing it fails only its own operations
  std::string lost_reason;  // set once it is lost
  std::optional<deadline> loss_pending;  // broke without a goodbye: fails the rank at this time
  std::optional<deadline> drained_at;    // said goodbye: its receives still open then fail
  std::string loss_why;
};

}  // namespace detail

class ucx {
  struct state;

 public:
  using request = detail::pending_request<state, detail::ucx_op>;

  // Joins the job: rank 0 starts the rendezvous store, every rank publishes its UCP
  // worker address and creates an endpoint to every rank. Collective.
  explicit ucx(const ucx_options& options) : state_(std::make_shared<state>(options)) { state_->join(); }

  ucx(ucx&&) noexcept = default;
  ucx& operator=(ucx&&) noexcept = default;
  // Says goodbye to every peer (or, while an exception unwinds, why this rank failed),
  // flushes what it sent, and closes its endpoints.
  ~ucx() {
    if (!state_) return;
    if (std::uncaught_exceptions() > 0)
      state_->abort_all(errc::peer_lost, "it is unwinding an exception");
    else
      state_->say_goodbye();
  }

  int rank() const noexcept { return state_->options.rank; }
  int size() const noexcept { return state_->options.size; }
  // Which ranks share a host, from the host identities exchanged at join
  // (concepts::topology_aware_transport); hosts are shown by their identity.
  const cluster::topology& topology() const noexcept { return state_->topology; }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    return detail::start_operation(state_, state_->make_op(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size()),
                                   [&](detail::ucx_op& op) { state_->post_send(op); });
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    return detail::start_operation(state_, state_->make_op(false, peer, tag, bytes.data(), bytes.size()),
                                   [&](detail::ucx_op& op) { state_->post_recv(op); });
  }
  void wait(request& r, deadline until) { detail::finish_operation(*state_, r, until, "ucx"); }

  // As asio_tcp::wait_any: the index of a request that wait() finishes without blocking.
  std::size_t wait_any(std::span<request* const> requests, deadline until) { return state_->wait_any(requests, until); }

  // As asio_tcp::tolerate_loss: losing `peer` fails only the operations that involve it.
  void tolerate_loss(int peer) {
    if (peer < 0 || peer >= size() || peer == rank())
      throw error(errc::invalid_argument, "ucx::tolerate_loss: rank " + std::to_string(peer) + " is not a peer");
    state_->peers[peer].tolerated = true;
  }
  std::vector<int> lost_peers() const { return state_->lost; }

  // Payload this rank has sent and received, puts and gets included (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

  // Marks this rank failed and tells every peer why (see asio_tcp::fail).
  void fail(errc cause, const std::string& reason) { state_->abort_all(cause, reason); }

  // --- one-sided access (concepts::one_sided_transport) ------------------------------

  // Memory this rank lets its peers put into and get from, registered with UCX for the
  // window's life. key() is what a peer passes to attach() (it holds the address, the
  // size and UCX's packed remote key).
  class memory_window {
   public:
    std::span<const std::byte> key() const noexcept { return key_; }

   private:
    friend class ucx;
    struct unmap {
      std::shared_ptr<state> owner;
      void operator()(ucp_mem_h m) const noexcept { ucp_mem_unmap(owner->context.get(), m); }
    };
    std::unique_ptr<ucp_mem, unmap> memory_;
    std::vector<std::byte> key_;
  };

  // A peer's exposed memory, usable from this rank until destroyed or the peer is gone.
  class remote_window {
   public:
    int peer() const noexcept { return rkey_.get_deleter().peer; }
    std::size_t size() const noexcept { return size_; }

   private:
    friend class ucx;
    struct release {
      std::shared_ptr<state> owner;
      int peer;
      void operator()(ucp_rkey_h k) const noexcept { owner->release_rkey(peer, k); }
    };
    // Small puts and gets go through the endpoint with error handling, large ones through
    // the bulk endpoint (as for messages); a key serves only the endpoint it was unpacked on.
    std::unique_ptr<ucp_rkey, release> rkey_, bulk_rkey_;
    std::uint64_t address_;
    std::size_t size_;
  };

  memory_window expose(std::span<std::byte> memory) { return state_->expose(state_, memory); }
  remote_window attach(int peer, std::span<const std::byte> key) { return state_->attach(state_, peer, key); }

  // Writes `bytes` at `offset` of the peer's window; done once they are in its memory.
  request async_put(remote_window& to, std::size_t offset, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    auto op = state_->make_one_sided_op(to, offset, const_cast<std::byte*>(bytes.data()), bytes.size(), "put to");
    return detail::start_operation(state_, std::move(op), [&](detail::ucx_op& o) {
      state_->post_one_sided(o, to, to.address_ + offset, true);
    });
  }
  // Reads `bytes.size()` bytes at `offset` of the peer's window into `bytes`.
  request async_get(remote_window& from, std::size_t offset, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    auto op = state_->make_one_sided_op(from, offset, bytes.data(), bytes.size(), "get from");
    return detail::start_operation(state_, std::move(op), [&](detail::ucx_op& o) {
      state_->post_one_sided(o, from, from.address_ + offset, false);
    });
  }

  // Whether put and get beat tagged messages to `peer` (ucx_options::one_sided).
  bool prefers_one_sided(int peer) const {
    using use = ucx_options::one_sided_use;
    if (state_->options.one_sided == use::never || peer < 0 || peer >= size()) return false;
    if (state_->options.one_sided == use::always) return true;
    return state_->peers[peer].same_host && detail::ucx_may_use_shared_memory();
  }

 private:
  struct state {
    using status = detail::ucx_op::status;

    explicit state(const ucx_options& o)
        : options(o), dedicated(static_cast<unsigned>(o.local_size) <= std::max(1u, std::thread::hardware_concurrency())) {
      if (o.size < 1) throw error(errc::config, "ucx: world size must be >= 1, got " + std::to_string(o.size));
      if (o.size > detail::ucx_tag::max_ranks)
        throw error(errc::config, "ucx: at most " + std::to_string(detail::ucx_tag::max_ranks) + " ranks, got " +
                                      std::to_string(o.size));
      if (o.rank < 0 || o.rank >= o.size)
        throw error(errc::config, "ucx: rank " + std::to_string(o.rank) + " is outside 0.." + std::to_string(o.size - 1));
      peers.resize(static_cast<std::size_t>(o.size));
      topology = cluster::topology::one_host(o.size);  // until join() learns better
      open_worker();
    }
    ~state() {
      close_endpoints();
      worker.reset();
      context.reset();
    }

    // --- setting up ----------------------------------------------------------------

    void open_worker() {
      // UCX's TCP moves messages through 8 KiB send and 64 KiB receive segments; larger
      // ones cut the system calls per message (2-rank all-reduce over loopback, 1-64 MiB:
      // 1.1-1.2 -> 1.4-2.3 GB/s busbw, the 2-core development VM).
      // (Through the environment, without overwriting: UCX 1.13's TCP transport does not
      // take these from ucp_config_modify.)
      const long long beat = options.heartbeat_interval.count();
      const std::string beat_text = std::to_string(beat > 0 ? beat : 1) + "s";
      if (detail::ucx_may_use_tcp()) {
        ::setenv("UCX_TCP_TX_SEG_SIZE", "256k", 0);
        ::setenv("UCX_TCP_RX_SEG_SIZE", "1m", 0);
        if (beat > 0) {  // a host cut off from the network answers no probe: its sockets fail
          ::setenv("UCX_TCP_KEEPIDLE", beat_text.c_str(), 0);
          ::setenv("UCX_TCP_KEEPINTVL", beat_text.c_str(), 0);
          ::setenv("UCX_TCP_KEEPCNT", std::to_string(std::max(1, options.heartbeat_misses)).c_str(), 0);
        }
      }
      ucp_config_t* raw_config = nullptr;
      detail::ucx_check(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read");
      detail::ucp_config_ptr config(raw_config);
      // Shared-memory transports detect a dead peer only when asked to (keepalive checks
      // that its process still exists), and keepalive runs every 20 s unless told otherwise.
      if (detail::ucx_may_use_shared_memory()) detail::ucx_default(config.get(), "MM_ERROR_HANDLING", "y");
      detail::ucx_default(config.get(), "KEEPALIVE_INTERVAL", beat_text.c_str());
      ucp_params_t params{};
      params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
      params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
      if (options.one_sided != ucx_options::one_sided_use::never) params.features |= UCP_FEATURE_RMA;
      params.estimated_num_eps = static_cast<std::size_t>(options.size);
      ucp_context_h raw_context = nullptr;
      detail::ucx_check(ucp_init(&params, config.get(), &raw_context), "ucp_init");
      context.reset(raw_context);

      ucp_worker_params_t worker_params{};
      worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      // One thread at a time, not always the same one (the collectives' background thread).
      worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
      ucp_worker_h raw_worker = nullptr;
      detail::ucx_check(ucp_worker_create(context.get(), &worker_params, &raw_worker), "ucp_worker_create");
      worker.reset(raw_worker);
      detail::ucx_check(ucp_worker_get_efd(worker.get(), &event_fd), "ucp_worker_get_efd");
    }

    std::vector<std::byte> worker_address() {
      ucp_address_t* address = nullptr;
      std::size_t length = 0;
      detail::ucx_check(ucp_worker_get_address(worker.get(), &address, &length), "ucp_worker_get_address");
      // [u32 world size this rank was started with][u64 host id][UCP worker address]
      std::vector<std::byte> out(address_header + length);
      const auto size = static_cast<std::uint32_t>(options.size);
      const std::uint64_t host = detail::ucx_host_id();
      std::memcpy(out.data(), &size, sizeof size);
      std::memcpy(out.data() + sizeof size, &host, sizeof host);
      std::memcpy(out.data() + address_header, address, length);
      ucp_worker_release_address(worker.get(), address);
      return out;
    }

    void join() {
      const int me = options.rank, n = options.size;
      const auto until = deadline_after(options.connect_timeout);
      auto left = [&] {
        return std::max(std::chrono::milliseconds(1),
                        std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()));
      };
      std::vector<std::vector<std::byte>> addresses(static_cast<std::size_t>(n));
      addresses[me] = worker_address();
      std::optional<rendezvous::store_client> client;
      if (n > 1) {
        if (options.store_port == 0)
          throw error(errc::config, "ucx: a job of " + std::to_string(n) +
                                        " ranks needs the rendezvous store's port (MASTER_PORT)");
        if (me == 0 && options.serve_store) store_server.emplace(options.store_host, options.store_port, options.job_token);
        auto& store = client.emplace(options.store_host, options.store_port, options.job_token, left());
        store.set(options.store_prefix + std::to_string(me), addresses[me]);
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          store.set_timeout(left());
          try {
            addresses[r] = store.get(options.store_prefix + std::to_string(r));
          } catch (const error& e) {
            if (e.kind() != errc::timeout) throw;
            throw error(errc::timeout, "rank " + std::to_string(me) + ": rank " + std::to_string(r) +
                                           " did not connect (publish its UCX address) within " +
                                           std::to_string(options.connect_timeout.count()) +
                                           " ms: did it start, with the same WORLD_SIZE and job token?");
          }
          std::uint32_t size = 0;
          if (addresses[r].size() <= address_header)
            throw error(errc::protocol, "rank " + std::to_string(r) + " published a malformed UCX address");
          std::memcpy(&size, addresses[r].data(), sizeof size);
          if (size != static_cast<std::uint32_t>(n))
            throw error(errc::config, "rank " + std::to_string(r) + " was started with world size " +
                                          std::to_string(size) + ", rank " + std::to_string(me) + " with " +
                                          std::to_string(n) + ": give every rank the same WORLD_SIZE");
        }
        // Which ranks share this rank's host: one more store key per rank.
        const std::string identity = rendezvous::local_host_identity(options.host_id);
        topology = rendezvous::exchange_topology(store, options.store_prefix + "host/", me, n, identity, identity, left());
      }
      // A second endpoint for bulk messages only pays where it unlocks a transport: shared memory.
      const bool bulk = options.peer_error_handling && options.bulk_bytes > 0 && detail::ucx_may_use_shared_memory();
      for (int r = 0; r < n; ++r) {
        std::uint64_t host = 0;
        std::memcpy(&host, addresses[r].data() + sizeof(std::uint32_t), sizeof host);
        peers[r].same_host = host == detail::ucx_host_id();
        peers[r].ep = connect(r, addresses[r], options.peer_error_handling);
        peers[r].bulk_ep = bulk && r != me ? connect(r, addresses[r], false) : peers[r].ep;
      }
      post_control_receive();
      greet_everyone(until);
      joining = false;
    }

    // Every rank hears from every other before it goes on, as over TCP: a rank that
    // finishes (or fails) early cannot leave before a slower one has reached it, and no
    // rank still needs the store (rank 0's) once it has been greeted.
    void greet_everyone(deadline until) {
      const int me = options.rank, n = options.size;
      std::vector<std::unique_ptr<detail::ucx_op>> ops;
      std::uint32_t hello = 1;
      std::vector<std::uint32_t> heard(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        auto send = make_op(true, r, detail::ucx_tag::join_tag, reinterpret_cast<std::byte*>(&hello), sizeof hello);
        post_send(*send);
        ops.push_back(std::move(send));
        auto recv = make_op(false, r, detail::ucx_tag::join_tag, reinterpret_cast<std::byte*>(&heard[r]), sizeof hello);
        post_recv(*recv);
        ops.push_back(std::move(recv));
      }
      auto all_done = [&] { return std::all_of(ops.begin(), ops.end(), [](const auto& o) { return o->state == status::done; }); };
      const bool done = progress_until(all_done, until);
      std::string missing;
      for (auto& op : ops) {
        if (!op->is_send && op->state != status::done) missing += (missing.empty() ? "" : ", ") + std::to_string(op->peer);
        if (op->state != status::done) cancel(*op);
        forget(*op);
      }
      throw_if_failed();
      if (!done)
        throw error(errc::timeout, "rank " + std::to_string(me) + ": ranks " + missing + " did not connect within " +
                                       std::to_string(options.connect_timeout.count()) + " ms");
      for (auto& op : ops)
        if (op->failure != errc{}) throw error(op->failure, op->message.empty() ? why_failed(*op) : op->message);
    }

    static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
      auto* self = static_cast<state*>(arg);
      for (std::size_t r = 0; r < self->peers.size(); ++r)
        if (self->peers[r].ep == ep || self->peers[r].bulk_ep == ep) self->broken_endpoints.emplace_back(static_cast<int>(r), status);
    }

    ucp_ep_h connect(int peer, const std::vector<std::byte>& address, bool error_handling) {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.address = reinterpret_cast<const ucp_address_t*>(address.data() + address_header);
      p.err_mode = error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      p.err_handler.cb = &state::on_endpoint_error;
      p.err_handler.arg = this;
      ucp_ep_h ep = nullptr;
      const ucs_status_t s = ucp_ep_create(worker.get(), &p, &ep);
      if (s != UCS_OK)
        throw error(errc::config, "rank " + std::to_string(options.rank) + ": UCX cannot reach rank " +
                                      std::to_string(peer) + ": " + detail::ucx_status_text(s) +
                                      " (do UCX_TLS and UCX_NET_DEVICES allow a transport between them?)");
      return ep;
    }

    // --- operations ----------------------------------------------------------------

    std::unique_ptr<detail::ucx_op> make_op(bool is_send, int peer, std::uint64_t tag, std::byte* data,
                                            std::size_t bytes) {
      if (peer < 0 || peer >= options.size)
        throw error(errc::invalid_argument, "ucx: rank " + std::to_string(options.rank) + " addressed rank " +
                                                std::to_string(peer) + " in a job of " + std::to_string(options.size));
      if (tag > detail::ucx_tag::user_mask || (tag == detail::ucx_tag::join_tag && !joining))
        throw error(errc::invalid_argument, "ucx: tag " + std::to_string(tag) + " is not below 2^48 - 1");
      throw_if_failed();
      auto op = std::make_unique<detail::ucx_op>();
      op->is_send = is_send;
      op->peer = peer;
      op->tag = tag;
      op->data = data;
      op->bytes = bytes;
      return op;
    }

    // --- one-sided access ------------------------------------------------------------

    memory_window expose(const std::shared_ptr<state>& self, std::span<std::byte> memory) {
      if (memory.empty()) throw error(errc::invalid_argument, "ucx::expose: an empty window");
      ucp_mem_map_params_t p{};
      p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      p.address = memory.data();
      p.length = memory.size();
      ucp_mem_h mapped = nullptr;
      detail::ucx_check(ucp_mem_map(context.get(), &p, &mapped), "ucp_mem_map");
      memory_window w;
      w.memory_ = {mapped, memory_window::unmap{self}};
      void* packed = nullptr;
      std::size_t packed_size = 0;
      detail::ucx_check(ucp_rkey_pack(context.get(), mapped, &packed, &packed_size), "ucp_rkey_pack");
      // [u64 address][u64 size][UCX's packed remote key]
      const std::uint64_t header[2] = {reinterpret_cast<std::uintptr_t>(memory.data()), memory.size()};
      w.key_.resize(sizeof header + packed_size);
      std::memcpy(w.key_.data(), header, sizeof header);
      std::memcpy(w.key_.data() + sizeof header, packed, packed_size);
      ucp_rkey_buffer_release(packed);
      return w;
    }

    remote_window attach(const std::shared_ptr<state>& self, int peer, std::span<const std::byte> key) {
      if (peer < 0 || peer >= options.size)
        throw error(errc::invalid_argument, "ucx::attach: rank " + std::to_string(peer) + " is not in the job");
      std::uint64_t header[2];
      if (key.size() <= sizeof header)
        throw error(errc::protocol, "ucx::attach: rank " + std::to_string(peer) + "'s window key is malformed (" +
                                        std::to_string(key.size()) + " bytes)");
      throw_if_failed();
      auto& p = peers[peer];
      if (!p.lost_reason.empty()) throw error(errc::peer_lost, p.lost_reason);
      if (!p.bulk_ep) throw error(errc::peer_lost, finished_message(peer));
      std::memcpy(header, key.data(), sizeof header);
      auto unpack = [&](ucp_ep_h ep) {
        ucp_rkey_h rkey = nullptr;
        const ucs_status_t s = ucp_ep_rkey_unpack(ep, key.data() + sizeof header, &rkey);
        if (s != UCS_OK)
          throw error(errc::protocol, "ucx::attach: cannot unpack rank " + std::to_string(peer) +
                                          "'s window key: " + detail::ucx_status_text(s));
        p.rkeys.push_back(rkey);
        return std::unique_ptr<ucp_rkey, remote_window::release>(rkey, remote_window::release{self, peer});
      };
      remote_window w;
      w.rkey_ = unpack(p.ep);
      if (p.bulk_ep != p.ep) w.bulk_rkey_ = unpack(p.bulk_ep);
      w.address_ = header[0];
      w.size_ = static_cast<std::size_t>(header[1]);
      return w;
    }

    // UCX wants a remote key destroyed before its endpoint: closing an endpoint destroys
    // the keys unpacked on it, and a window released later finds its key gone.
    void release_rkey(int peer, ucp_rkey_h rkey) noexcept {
      auto& keys = peers[peer].rkeys;
      if (const auto it = std::find(keys.begin(), keys.end(), rkey); it != keys.end()) {
        keys.erase(it);
        ucp_rkey_destroy(rkey);
      }
    }

    std::unique_ptr<detail::ucx_op> make_one_sided_op(const remote_window& w, std::size_t offset, std::byte* data,
                                                      std::size_t bytes, const char* what) {
      if (!w.rkey_) throw error(errc::invalid_argument, std::string("ucx: ") + what + " an empty remote window");
      if (offset > w.size_ || bytes > w.size_ - offset)
        throw error(errc::invalid_argument, std::string("ucx: ") + what + " rank " + std::to_string(w.peer()) + ": " +
                                                std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                                                " do not fit its window of " + std::to_string(w.size_) + " bytes");
      auto op = make_op(true, w.peer(), 0, data, bytes);
      op->one_sided = true;
      op->what = what;
      return op;
    }

    // A put is done once its bytes are in the peer's memory: the flush that follows it
    // reports (UCX's own completion of a put only frees the local buffer).
    // (A flush on the bulk endpoint, without error handling, may never complete once the
    // peer died; small operations therefore take the endpoint that reports failures.)
    void post_one_sided(detail::ucx_op& op, const remote_window& w, std::uint64_t remote, bool put) {
      if (peer_unavailable(op)) return;
      auto& p = peers[op.peer];
      const bool bulk = op.bytes >= options.bulk_bytes && w.bulk_rkey_;
      ucp_ep_h ep = bulk ? p.bulk_ep : p.ep;
      ucp_rkey_h rkey = bulk ? w.bulk_rkey_.get() : w.rkey_.get();
      if (std::find(p.rkeys.begin(), p.rkeys.end(), rkey) == p.rkeys.end())
        return op.finish(errc::peer_lost, "rank " + std::to_string(options.rank) + ": " + describe(op) +
                                              ": its window is gone with its endpoint");
      ucp_request_param_t done{};
      done.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      done.cb.send = &state::on_send_done;
      done.user_data = &op;
      if (!put) return track(op, ucp_get_nbx(ep, op.data, op.bytes, remote, rkey, &done));
      ucp_request_param_t quiet{};  // released by UCX when done; the flush reports
      const ucs_status_ptr_t r = ucp_put_nbx(ep, op.data, op.bytes, remote, rkey, &quiet);
      if (UCS_PTR_IS_ERR(r)) return track(op, r);
      if (r) ucp_request_free(r);
      track(op, ucp_ep_flush_nbx(ep, &done));
    }

    // Finishes the op at once if its peer cannot take part. A peer that finished sends
    // nothing more, but what it sent before its goodbye has arrived and may still match
    // a receive (post_recv checks), so only sends to it are refused outright.
    bool peer_unavailable(detail::ucx_op& op) {
      const auto& p = peers[op.peer];
      if (!p.lost_reason.empty()) return op.finish(errc::peer_lost, p.lost_reason), true;
      if (p.finished && op.is_send) return op.finish(errc::peer_lost, finished_message(op.peer)), true;
      return false;
    }

    static void on_send_done(void* request, ucs_status_t status, void* user_data) {
      auto* op = static_cast<detail::ucx_op*>(user_data);
      op->request = nullptr;
      ucp_request_free(request);
      // Cancelled by this rank (withdraw): whoever cancelled finishes it, with its reason.
      if (status == UCS_ERR_CANCELED) return;
      if (status != UCS_OK) op->finish(errc::peer_lost, "");  // described later (why_failed)
      else op->finish();
    }

    static void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
      auto* op = static_cast<detail::ucx_op*>(user_data);
      op->request = nullptr;
      ucp_request_free(request);
      finish_receive(op, status, info->length);
    }

    static void finish_receive(detail::ucx_op* op, ucs_status_t status, std::size_t length) {
      if (status == UCS_ERR_MESSAGE_TRUNCATED)
        op->finish(errc::mismatch, "message size mismatch: rank " + std::to_string(op->peer) + " sent more than the " +
                                       std::to_string(op->bytes) + " bytes (tag " + std::to_string(op->tag) +
                                       ") that this rank expected");
      else if (status == UCS_ERR_CANCELED)
        return;  // see on_send_done
      else if (status != UCS_OK)
        op->finish(errc::peer_lost, std::string("UCX receive failed: ") + detail::ucx_status_text(status));
      else if (length != op->bytes)
        op->finish(errc::mismatch, "message size mismatch: rank " + std::to_string(op->peer) + " sent " +
                                       std::to_string(length) + " bytes (tag " + std::to_string(op->tag) +
                                       ") but this rank expected " + std::to_string(op->bytes));
      else
        op->finish();
    }

    void post_send(detail::ucx_op& op) {
      if (peer_unavailable(op)) return;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &state::on_send_done;
      p.user_data = &op;
      const ucs_status_ptr_t r =
          ucp_tag_send_nbx(op.bytes >= options.bulk_bytes ? peers[op.peer].bulk_ep : peers[op.peer].ep, op.data, op.bytes,
                           detail::ucx_tag::data(options.rank, op.tag), &p);
      track(op, r);
    }

    void post_recv(detail::ucx_op& op) {
      if (peer_unavailable(op)) return;
      if (peers[op.peer].finished) {
        // It finished: only a message already here can match.
        ucp_tag_recv_info_t info;
        if (!ucp_tag_probe_nb(worker.get(), detail::ucx_tag::data(op.peer, op.tag), detail::ucx_tag::full_mask, 0, &info))
          return op.finish(errc::peer_lost, finished_message(op.peer));
      }
      ucp_request_param_t p{};
      // Always through the callback, which reports the length that arrived. (Only the
      // length: UCX 1.13 leaves sender_tag unset when a receive matches a message that
      // arrived first, so nothing here relies on it.)
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &state::on_recv_done;
      p.user_data = &op;
      const ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), op.data, op.bytes,
                                                  detail::ucx_tag::data(op.peer, op.tag), detail::ucx_tag::full_mask, &p);
      track(op, r);
    }

    void track(detail::ucx_op& op, ucs_status_ptr_t r) {
      if (UCS_PTR_IS_ERR(r) && op.is_send) {
        // Its endpoint failed, and UCX may not have said so yet: the op waits for the
        // verdict on the peer (a goodbye, an abort with a reason, or its loss).
        in_flight.push_back(&op);
        broken_endpoints.emplace_back(op.peer, UCS_PTR_STATUS(r));
      } else if (UCS_PTR_IS_ERR(r)) {
        op.finish(errc::peer_lost, describe(op) + " failed: " + detail::ucx_status_text(UCS_PTR_STATUS(r)));
      } else if (r == nullptr) {
        op.finish();  // a send that completed at once
      } else if (op.state == status::active) {
        op.request = r;
        in_flight.push_back(&op);
      }
    }

    // Finishes an op that UCX let go of (or never had) with `why`; one that failed in
    // UCX's callback without a reason gets this one.
    void complete_failure(detail::ucx_op& op, errc cause, const std::string& why) {
      if (op.state == status::active) op.finish(cause, why);
      else if (op.failure != errc{} && op.message.empty()) op.message = why;
    }

    void wait(detail::ucx_op& op, deadline until) {
      if (op.state == status::cancelled) throw error(errc::invalid_argument, "ucx: wait on a withdrawn request");
      if (!progress_until([&] { return op.state == status::done; }, until, op.peer)) {
        cancel(op);
        throw error(errc::timeout, detail::timeout_message(options.rank, describe(op)));
      }
      forget(op);
      if (op.failure != errc{}) throw error(op.failure, op.message.empty() ? why_failed(op) : op.message);
    }

    template <class Request>
    std::size_t wait_any(std::span<Request* const> requests, deadline until) {
      std::optional<std::size_t> ready;
      auto find = [&] {
        for (std::size_t i = 0; i < requests.size() && !ready; ++i)
          if (const auto* op = requests[i] ? requests[i]->peek() : nullptr; op && op->state == status::done) ready = i;
        return ready.has_value();
      };
      if (!progress_until([&] { return find() || failed.has_value(); }, until))
        throw error(errc::timeout, detail::wait_any_timeout_message(options.rank, requests.size()));
      if (!ready) throw_if_failed();
      return *ready;
    }

    // Withdraws an op that will not be waited for; returns once UCX no longer touches
    // its buffer. A receive is cancelled; a send cannot be, so it is given a moment to
    // finish, and otherwise its endpoint is closed (which fails the rank: a peer cannot
    // be left with half a message).
    void cancel(detail::ucx_op& op) noexcept {
      if (op.state == status::cancelled) return;
      if (op.request) {
        if (!op.is_send) ucp_request_cancel(worker.get(), op.request);
        settle(op);
        if (op.request) {
          fail_everything(errc::peer_lost, "rank " + std::to_string(options.rank) + ": an operation with rank " +
                                               std::to_string(op.peer) + " was abandoned mid-message (timeout or error)");
          settle(op);
        }
      }
      forget(op);
      op.state = status::cancelled;
    }

    // Fails an op that UCX may still hold: a receive is cancelled, and both wait until
    // UCX lets go of the buffer (a send's endpoint must be closed first to be released).
    void withdraw(detail::ucx_op& op, errc cause, const std::string& why) noexcept {
      if (!op.is_send && op.request) ucp_request_cancel(worker.get(), op.request);
      settle(op);
      complete_failure(op, cause, why);
    }

    // Progresses the worker until UCX has let go of op's request (bounded).
    void settle(detail::ucx_op& op) noexcept {
      const auto until = deadline_after(std::chrono::seconds(2));
      while (op.request && clock::now() < until)
        if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
    }

    void forget(detail::ucx_op& op) noexcept { std::erase(in_flight, &op); }

    // --- progress ------------------------------------------------------------------

    void warn_stall(clock::duration waited, int peer) const {
      const observe::activity& doing = observe::current_activity();
      char text[256];
      std::snprintf(text, sizeof text, "rank %d: waited %.1f s in %s (operation #%llu, step %llu) for %s%s", options.rank,
                    std::chrono::duration<double>(waited).count(), doing.name ? doing.name : "a transport wait",
                    static_cast<unsigned long long>(doing.operation),
                    static_cast<unsigned long long>(observe::current_step().load(std::memory_order_relaxed)),
                    peer >= 0 ? "rank " : "its peers", peer >= 0 ? std::to_string(peer).c_str() : "");
      observe::log_warning(options.rank, options.size, text,
                           ": it is alive as far as UCX can tell but has not answered (stopped, hung, in a long "
                           "computation, or waiting for another rank: look at its own warning)");
    }

    unsigned progress_once() {
      unsigned n = 0;
      while (unsigned k = ucp_worker_progress(worker.get())) n += k;
      handle_events();
      return n;
    }

    // `peer`: the rank waited for, named if the wait lasts options.stall_warn (-1: several).
    template <class Done>
    bool progress_until(Done&& done, deadline until, int peer = -1) {
      const auto began = clock::now();
      const auto poll_stop = began + (dedicated ? options.poll_before_sleep : options.poll_before_sleep / 4);
      bool warned = false;
      for (;;) {
        progress_once();
        if (done()) return true;
        const auto now = clock::now();
        if (now >= until) return false;
        if (now < poll_stop) {
          if (!dedicated) std::this_thread::yield();
          continue;
        }
        if (!warned && now - began >= options.stall_warn) {  // sleeping waits wake every keepalive_wake
          warned = true;
          warn_stall(now - began, peer);
        }
        const ucs_status_t armed = ucp_worker_arm(worker.get());
        if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them
        detail::ucx_check(armed, "ucp_worker_arm");
        auto sleep = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
                                  std::chrono::milliseconds(1),
                              options.keepalive_wake);
        for (const auto& p : peers)
          if (p.loss_pending)
            sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(*p.loss_pending - now) +
                                        std::chrono::milliseconds(1));
        detail::wait_for_event(event_fd, sleep);
      }
    }

    // What UCX reported from inside its callbacks, handled outside them.
    void handle_events() {
      // A failure report that arrives while this rank still greets is about the job's
      // first operation: it is reported there, as over TCP, not as a failed join.
      while (control_arrived && !joining) {
        control_arrived = false;
        on_control();
      }
      while (!broken_endpoints.empty()) {
        const auto [peer, s] = broken_endpoints.front();
        broken_endpoints.erase(broken_endpoints.begin());
        on_broken(peer, s);
      }
      const auto now = clock::now();
      for (std::size_t r = 0; r < peers.size(); ++r)
        if (peers[r].drained_at && now >= *peers[r].drained_at) {
          peers[r].drained_at.reset();
          fail_receives_from(static_cast<int>(r));
        }
      for (std::size_t r = 0; r < peers.size(); ++r)
        if (peers[r].loss_pending && now >= *peers[r].loss_pending) {
          peers[r].loss_pending.reset();
          fail_everything(errc::peer_lost, peers[r].loss_why);
        }
    }

    // --- control messages ------------------------------------------------------------

    static void on_control_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
      auto* self = static_cast<state*>(user_data);
      self->control_request = nullptr;
      ucp_request_free(request);
      if (status != UCS_OK) return;  // cancelled at shutdown
      self->control_arrived = true;
      self->control_length = info->length;
    }

    void post_control_receive() {
      control_buffer.resize(max_control_bytes);
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &state::on_control_done;
      p.user_data = this;
      const ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), control_buffer.data(), control_buffer.size(),
                                                  detail::ucx_tag::control_bit, detail::ucx_tag::control_bit, &p);
      if (UCS_PTR_IS_ERR(r)) detail::ucx_check(UCS_PTR_STATUS(r), "ucp_tag_recv_nbx (control)");
      control_request = r;
    }

    void on_control() {
      // Payload: u32 sender, u32 kind, u32 cause (errc), then the reason as text.
      if (control_length < 12) return post_control_receive();
      std::uint32_t header[3];
      std::memcpy(header, control_buffer.data(), sizeof header);
      const int peer = static_cast<int>(header[0]);
      const auto kind = static_cast<detail::ucx_control>(header[1]);
      const auto cause = static_cast<errc>(header[2]);
      const std::string reason(reinterpret_cast<const char*>(control_buffer.data()) + sizeof header,
                               control_length - sizeof header);
      post_control_receive();
      if (peer < 0 || peer >= options.size) return;
      if (kind == detail::ucx_control::goodbye) return on_goodbye(peer);
      if (kind == detail::ucx_control::abort) {
        const std::string why = "rank " + std::to_string(options.rank) + ": rank " + std::to_string(peer) + " failed: " + reason;
        if (peers[peer].tolerated) return isolate(peer, "rank " + std::to_string(options.rank) + ": lost rank " +
                                                            std::to_string(peer) + ": it failed: " + reason);
        fail_everything(cause == errc::mismatch ? errc::mismatch : errc::peer_lost, why);
      }
    }

    void on_goodbye(int peer) {
      auto& p = peers[peer];
      p.finished = true;
      p.loss_pending.reset();
      // It flushed everything it sent before saying goodbye, so its messages are here or
      // being received (a rendezvous in progress cannot be told from a receive that
      // waits in vain): receives from it still open a moment from now never complete.
      p.drained_at = deadline_after(std::chrono::seconds(1));
    }

    void fail_receives_from(int peer) {
      for (auto* op : std::vector<detail::ucx_op*>(in_flight))
        if (!op->is_send && op->peer == peer && op->state == status::active)
          withdraw(*op, errc::peer_lost, finished_message(peer));
    }

    // Sends one control message to every live peer and waits (briefly) until they left.
    void send_control(detail::ucx_control kind, errc cause, const std::string& text) {
      std::vector<detail::ucx_op> sends(peers.size());
      const std::uint32_t header[3] = {static_cast<std::uint32_t>(options.rank), static_cast<std::uint32_t>(kind),
                                       static_cast<std::uint32_t>(cause)};
      std::vector<std::byte> payload(sizeof header + text.size());
      std::memcpy(payload.data(), header, sizeof header);
      std::memcpy(payload.data() + sizeof header, text.data(), text.size());
      for (int r = 0; r < options.size; ++r) {
        auto& p = peers[r];
        if (r == options.rank || !p.ep || !p.lost_reason.empty() || p.finished) continue;
        auto& op = sends[r];
        op.is_send = true;
        op.peer = r;
        ucp_request_param_t prm{};
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send = &state::on_send_done;
        prm.user_data = &op;
        const ucs_status_ptr_t s =
            ucp_tag_send_nbx(p.ep, payload.data(), payload.size(), detail::ucx_tag::control(options.rank), &prm);
        if (UCS_PTR_IS_PTR(s)) op.request = s;
      }
      const auto until = deadline_after(std::chrono::milliseconds(500));
      auto all_sent = [&] { return std::none_of(sends.begin(), sends.end(), [](const auto& o) { return o.request != nullptr; }); };
      while (!all_sent() && clock::now() < until)
        if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
      if (!all_sent()) close_endpoints();  // releases what is left, so `sends` may go
      flush(deadline_after(std::chrono::milliseconds(500)));
    }

    // Waits (bounded) until what this rank sent has reached its peers.
    void flush(deadline until) {
      ucp_request_param_t p{};
      const ucs_status_ptr_t r = ucp_worker_flush_nbx(worker.get(), &p);
      if (!UCS_PTR_IS_PTR(r)) return;
      while (ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until)
        if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker.get(), r);
      ucp_request_free(r);
    }

    void say_goodbye() {
      if (failed || said_goodbye) return;
      said_goodbye = true;
      // Everything this rank sent arrives before its goodbye (see on_goodbye).
      flush(deadline_after(std::chrono::seconds(2)));
      send_control(detail::ucx_control::goodbye, errc{}, {});
    }

    void abort_all(errc cause, const std::string& reason) {
      if (failed) return;
      send_control(detail::ucx_control::abort, cause, reason.substr(0, max_control_bytes - 12));
      fail_everything(cause, "rank " + std::to_string(options.rank) + " failed: " + reason);
    }

    // --- failure ---------------------------------------------------------------------

    void on_broken(int peer, ucs_status_t s) {
      auto& p = peers[peer];
      if (!p.lost_reason.empty() || failed) return;
      const std::string why = "rank " + std::to_string(options.rank) + ": lost rank " + std::to_string(peer) +
                              ": its endpoint failed (" + detail::ucx_status_text(s) +
                              "; the process exited or was killed)";
      if (p.finished) {
        // It said goodbye and left. Sends to it still in flight carried what it wanted
        // (it would not have finished without them); UCX fails them as the endpoint
        // closes, so they are settled first. Receives from it drain (on_goodbye).
        for (auto* op : in_flight)
          if (op->is_send && !op->one_sided && op->peer == peer) op->finish();
        close_endpoint(p);
        for (auto* op : in_flight)
          if (op->is_send && op->peer == peer) settle(*op);  // UCX lets go before anyone frees it
        return;
      }
      if (p.tolerated) return isolate(peer, why);
      // Its goodbye or abort may still be on the way (another lane): give it a moment.
      if (!p.loss_pending) {
        p.loss_pending = deadline_after(std::chrono::milliseconds(200));
        p.loss_why = why;
      }
    }

    // A peer is gone: its operations fail, the rest of the rank goes on.
    void isolate(int peer, const std::string& why) {
      auto& p = peers[peer];
      if (!p.lost_reason.empty()) return;
      p.lost_reason = why;
      if (!p.finished) lost.push_back(peer);
      close_endpoint(p);  // first: releases the sends to it
      for (auto* op : std::vector<detail::ucx_op*>(in_flight))
        if (op->peer == peer) withdraw(*op, errc::peer_lost, why);
    }

    void fail_everything(errc cause, const std::string& why) {
      if (failed) return;
      failed.emplace(cause, why);
      close_endpoints();  // first: releases the sends still in UCX
      for (auto* op : std::vector<detail::ucx_op*>(in_flight)) withdraw(*op, cause, why);
    }

    void close_endpoint(detail::ucx_peer& p) noexcept {
      for (ucp_rkey_h k : std::exchange(p.rkeys, {})) ucp_rkey_destroy(k);
      if (p.bulk_ep != p.ep) close_endpoint(std::exchange(p.bulk_ep, nullptr));
      p.bulk_ep = nullptr;
      close_endpoint(std::exchange(p.ep, nullptr));
    }

    void close_endpoint(ucp_ep_h ep) noexcept {
      if (!ep) return;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      const ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
      if (!UCS_PTR_IS_PTR(r)) return;
      const auto until = deadline_after(std::chrono::seconds(1));
      while (ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until) ucp_worker_progress(worker.get());
      ucp_request_free(r);
    }

    void close_endpoints() noexcept {
      if (!worker) return;
      for (auto& p : peers) close_endpoint(p);
      if (control_request) ucp_request_cancel(worker.get(), control_request);  // its callback frees it
    }

    void throw_if_failed() const {
      if (failed) throw error(failed->first, failed->second);
    }

    std::string why_failed(const detail::ucx_op& op) const {
      if (failed) return failed->second;
      const auto& p = peers[op.peer];
      if (!p.lost_reason.empty()) return p.lost_reason;
      return "rank " + std::to_string(options.rank) + ": " + describe(op) + " failed";
    }

    std::string finished_message(int peer) const {
      return "rank " + std::to_string(options.rank) + ": rank " + std::to_string(peer) +
             " has finished (said goodbye) and will send nothing more";
    }

    static std::string describe(const detail::ucx_op& op) {
      if (op.one_sided) return std::string(op.what) + " rank " + std::to_string(op.peer) + " (" + std::to_string(op.bytes) + " bytes)";
      return detail::describe_operation(op.is_send, op.peer, op.tag, op.bytes);
    }

    static constexpr std::size_t max_control_bytes = std::size_t{64} << 10;
    static constexpr std::size_t address_header = sizeof(std::uint32_t) + sizeof(std::uint64_t);
    ucx_options options;
    bool dedicated;
    detail::ucp_context_ptr context;
    detail::ucp_worker_ptr worker;
    int event_fd = -1;
    std::optional<rendezvous::store_server> store_server;  // rank 0 only
    cluster::topology topology;
    std::vector<detail::ucx_peer> peers;
    std::vector<detail::ucx_op*> in_flight;  // ops UCX holds a request for
    std::vector<int> lost;
    std::optional<std::pair<errc, std::string>> failed;
    bool said_goodbye = false;
    bool joining = true;  // only the join may use ucx_tag::join_tag
    // The standing receive for control messages, and what its callback saw.
    std::vector<std::byte> control_buffer;
    void* control_request = nullptr;
    bool control_arrived = false;
    std::size_t control_length = 0;
    std::vector<std::pair<int, ucs_status_t>> broken_endpoints;  // from the error callback
  };

  std::shared_ptr<state> state_;
  traffic_counters traffic_;
};

static_assert(concepts::transport<ucx> && concepts::failable_transport<ucx>);
static_assert(concepts::multiplexing_transport<ucx> && concepts::loss_tolerant_transport<ucx>);
static_assert(concepts::one_sided_transport<ucx> && concepts::metered_transport<ucx>);
static_assert(concepts::topology_aware_transport<ucx>);

}  // namespace gradwire::transport
