// Boost.Asio TCP transport: one connection per pair of ranks, tagged messages in wire frames, deadlines everywhere.
//
// Progress is made by the thread that waits: wait() runs the rank's io_context until
// its request completes or its deadline passes, so a message costs no hand-off between
// threads and an idle rank sleeps in epoll. A rank's endpoint is used by one thread at a
// time (the collectives' background thread, or the caller).
//
// Messages move without staging copies where the order of events allows: a send
// writes the frame header and the caller's buffer with one gathered write; a receive
// posted before its message arrives is read straight into the caller's buffer. A
// message that arrives first is buffered if it is small (eager, up to eager_bytes);
// a large one stays in the kernel's socket buffers until its receive is posted, and
// is then read straight into place. Later messages on that connection wait behind it.
//
// A connection that breaks (the peer exited or was killed), a frame that does not
// parse, or an abort frame from a peer that failed fails every pending and future
// operation of the rank with peer_lost (or the peer's own error kind) naming the rank
// that was lost, so a job stops as a whole instead of waiting for its deadlines.
#pragma once

#include <algorithm>
#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#endif

#include "../cluster/host_identity.hpp"
#include "../cluster/store.hpp"
#include "../cluster/topology.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/activity.hpp"
#include "../observe/log.hpp"
#include "../timeouts.hpp"
#include "detail/asio_support.hpp"
#include "detail/deliver.hpp"
#include "detail/messages.hpp"
#include "detail/pending_request.hpp"
#include "traffic.hpp"
#include "wire.hpp"

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
  // Unmatched messages up to this size are buffered on arrival; larger ones wait in
  // the kernel until their receive is posted.
  std::size_t eager_bytes = std::size_t{256} << 10;
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
  // (cluster::local_host_identity says why).
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
};

namespace detail {

struct tcp_op {
  enum class status : std::uint8_t { queued, active, done, cancelled };
  bool is_send = false;
  int peer = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;  // never written through for sends
  std::size_t bytes = 0;
  deliver_fn deliver = deliver_copy;  // receives: copy, or add (async_recv_accumulate)
  status state = status::queued;
  errc failure{};
  std::string message;
  wire::header_bytes header{};  // sends: the frame header, written with the payload

  void finish(errc e = {}, std::string why = {}) {
    state = status::done;
    failure = e;
    message = std::move(why);
  }
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

struct tcp_link {
  explicit tcp_link(tcp::socket s, int p) : socket(std::move(s)), peer(p) {}
  tcp::socket socket;
  int peer;
  bool alive = true;
  bool finished = false;  // the peer said goodbye: nothing more will arrive
  bool tolerated = false;  // losing this peer fails only its own operations (tolerate_loss)
  std::string lost_reason;  // why a tolerated peer was lost
  // Reading side.
  wire::header_bytes in_header{};
  wire::frame_header incoming;                   // header of the frame being read
  tcp_op* reading = nullptr;                     // receive whose payload is being read into place
  std::optional<arrived_message> reading_eager;  // or: eager payload being read
  bool parked = false;                           // `incoming` is large and waits for its receive
  std::deque<tcp_op*> receives;                  // posted, unmatched, in posting order
  std::deque<arrived_message> arrived;           // arrived, unmatched, in arrival order
  std::vector<std::byte> stage;                  // accumulating receives read through it in chunks
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

}  // namespace detail

class asio_tcp {
  struct state;

 public:
  using request = detail::pending_request<state, detail::tcp_op>;

  // Joins the job: rank 0 starts the rendezvous store, every rank listens, publishes
  // its address, and connects to every other rank (the higher rank of a pair dials).
  // Collective: every rank of the job calls it with the same size and token.
  explicit asio_tcp(const asio_tcp_options& options) : state_(std::make_shared<state>(options)) { state_->join(); }

  asio_tcp(asio_tcp&&) noexcept = default;
  asio_tcp& operator=(asio_tcp&&) noexcept = default;
  // Says goodbye to every peer, so that they can tell a rank that finished from one that
  // crashed; while an exception unwinds, says why it failed instead (an abort frame).
  ~asio_tcp() {
    if (!state_) return;
    if (std::uncaught_exceptions() > 0)
      state_->abort_all(errc::peer_lost, "it is unwinding an exception");
    else
      state_->say_goodbye();
  }

  int rank() const noexcept { return state_->options.rank; }
  int size() const noexcept { return state_->options.size; }
  // Which ranks share a host, from the host identities exchanged at join
  // (concepts::topology_aware_transport); hosts are shown by the address they listen on.
  const cluster::topology& topology() const noexcept { return state_->topology; }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    return detail::start_operation(state_, state_->make_op(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size()),
                                   [&](detail::tcp_op& op) { state_->post_send(op); });
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    return detail::start_operation(state_, state_->make_op(false, peer, tag, bytes.data(), bytes.size()),
                                   [&](detail::tcp_op& op) { state_->post_recv(op); });
  }
  // Receives inout.size() elements and adds them into inout as they arrive, chunk by
  // chunk, so the reduction overlaps the transfer and needs no full-size staging.
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    traffic_.received(inout.size_bytes());
    auto op = state_->make_op(false, peer, tag, reinterpret_cast<std::byte*>(inout.data()), inout.size_bytes());
    op->deliver = &detail::deliver_accumulate<V>;
    return detail::start_operation(state_, std::move(op), [&](detail::tcp_op& o) { state_->post_recv(o); });
  }
  void wait(request& r, deadline until) { detail::finish_operation(*state_, r, until, "asio_tcp"); }

  // Waits until one of `requests` can be waited for without blocking (its operation
  // has completed, successfully or not) and returns its index; it does not finish that
  // request: wait() on it then returns or throws at once. Empty requests are skipped.
  // Throws errc::timeout when none completes by `until`, and the rank's failure if it failed.
  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    return state_->wait_any(requests, until);
  }

  // Losing `peer` (its connection breaks, or it aborts) fails only the operations that
  // involve it, now and later, instead of the whole rank; lost_peers() lists such peers.
  // For roles that outlive a peer, e.g. a parameter server that drops a dead worker.
  void tolerate_loss(int peer) {
    if (peer < 0 || peer >= size() || peer == rank())
      throw error(errc::invalid_argument, "asio_tcp::tolerate_loss: rank " + std::to_string(peer) + " is not a peer");
    if (auto& link = state_->links[peer]) link->tolerated = true;
  }
  std::vector<int> lost_peers() const { return state_->lost; }

  // Payload this rank has sent and received (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

  // Marks this rank failed and tells every peer why (best effort, within a second), so
  // they fail with this reason instead of a bare lost connection. Used when a rank
  // detects a disagreement (collective mismatch) that its peers cannot see.
  void fail(errc cause, const std::string& reason) { state_->abort_all(cause, reason); }

 private:
  struct state {
    using status = detail::tcp_op::status;
    using tcp = detail::tcp;

    explicit state(const asio_tcp_options& o)
        : options(o),
          token(wire::token_hash(o.job_token)),
          // Asked once: glibc reads /sys for it on every call.
          dedicated(static_cast<unsigned>(o.local_size) <= std::max(1u, std::thread::hardware_concurrency())),
          work(io.get_executor()) {
      if (o.size < 1) throw error(errc::config, "asio_tcp: world size must be >= 1, got " + std::to_string(o.size));
      if (o.rank < 0 || o.rank >= o.size)
        throw error(errc::config, "asio_tcp: rank " + std::to_string(o.rank) + " is outside 0.." +
                                      std::to_string(o.size - 1) + " (world size " + std::to_string(o.size) + ")");
      links.resize(static_cast<std::size_t>(o.size));
      topology = cluster::topology::one_host(o.size);  // until join() learns better
      if (o.heartbeat_interval.count() < 0 || o.heartbeat_misses < 1 || o.stall_warn.count() <= 0 ||
          o.stall_timeout.count() < 0)
        throw error(errc::config, "asio_tcp: heartbeat_interval must be >= 0 s, heartbeat_misses >= 1, stall_warn > 0 "
                                  "and stall_timeout >= 0 (0: off)");
      waiting_for.reserve(links.size());
    }
    ~state() {
      for (auto& l : links)
        if (l) {
          boost::system::error_code ignored;
          l->socket.close(ignored);
        }
    }

    // --- joining ---------------------------------------------------------------------

    void join() {
      const int me = options.rank, n = options.size;
      if (n == 1) return;
      if (options.store_port == 0)
        throw error(errc::config, "asio_tcp: a job of " + std::to_string(n) +
                                      " ranks needs the rendezvous store's port (MASTER_PORT)");
      // One deadline for the whole join: every store call gets what is left of it.
      const auto until = deadline_after(options.connect_timeout);
      auto left = [&] {
        return std::max(std::chrono::milliseconds(1),
                        std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()));
      };
      const std::string me_text = "rank " + std::to_string(me);
      if (me == 0) store_server.emplace(options.store_host, options.store_port, options.job_token);
      cluster::store_client store(options.store_host, options.store_port, options.job_token, left());
      // An empty listen_host: listen where this rank reaches the store from, the
      // interface its peers most likely reach it through (no wildcard bind).
      const std::string host = options.listen_host.empty() ? store.local_address() : options.listen_host;
      tcp::acceptor acceptor = detail::listen(io, host, options.listen_port, me_text + "'s listening port");
      const std::uint16_t port = acceptor.local_endpoint().port();
      const bool wildcard = host == "0.0.0.0" || host == "::";
      store.set_timeout(left());
      store.set("gradwire/tcp/" + std::to_string(me), detail::address_text(wildcard ? store.local_address() : host, port));
      // Learn every lower rank's address first: they are the ones this rank dials.
      std::vector<std::pair<std::string, std::uint16_t>> addresses(static_cast<std::size_t>(me));
      for (int r = 0; r < me; ++r) {
        store.set_timeout(left());
        addresses[r] = detail::split_address(store.get_string("gradwire/tcp/" + std::to_string(r)),
                                             "the address rank " + std::to_string(r) + " published");
      }
      // Which ranks share this rank's host: one more store key per rank.
      topology = cluster::exchange_topology(store, "gradwire/tcp/host/", me, n, cluster::local_host_identity(options.host_id),
                                            wildcard ? store.local_address() : host, left());

      // Dial down, accept up, all at once, so no rank waits for another to finish.
      joining = true;
      join_pending = n - 1;
      for (int r = 0; r < me; ++r) dial(r, addresses[r], until);
      accept_peers(acceptor);
      const bool finished = detail::run_until(io, [&] { return join_pending == 0 || join_failure.has_value(); }, until);
      joining = false;
      acceptor.close();
      if (join_failure) throw *join_failure;
      if (!finished) {
        std::string missing;
        for (int r = 0; r < n; ++r)
          if (r != me && !links[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        throw error(errc::timeout, me_text + ": ranks " + missing + " did not connect within " +
                                       std::to_string(options.connect_timeout.count()) +
                                       " ms: did they start, with the same WORLD_SIZE and job token?");
      }
      for (auto& l : links)
        if (l) read_header(*l);
      start_watch();
    }

    void dial(int peer, const std::pair<std::string, std::uint16_t>& address, deadline until) {
      auto socket = std::make_shared<tcp::socket>(detail::connect_with_retry(
          io, address.first, address.second, "rank " + std::to_string(peer), until));
      hello(*socket);
      auto reply = std::make_shared<wire::header_bytes>();
      boost::asio::async_read(*socket, boost::asio::buffer(*reply), [this, peer, socket, reply](
                                                                         const boost::system::error_code& ec, std::size_t) {
        if (!joining) return;
        const std::string who = "rank " + std::to_string(peer);
        try {
          if (ec) throw error(errc::peer_lost, who + " closed the connection during the handshake: " + ec.message());
          const auto h = wire::decode(*reply, token, who);
          if (h.kind == wire::frame_kind::refuse) {
            std::vector<std::byte> why(std::min<std::size_t>(h.length, 4096));
            boost::system::error_code ignored;
            boost::asio::read(*socket, boost::asio::buffer(why), ignored);
            const std::string text(reinterpret_cast<const char*>(why.data()), why.size());
            throw error(text.find("token") != std::string::npos ? errc::auth : errc::config,
                        who + " refused this rank's connection: " + text);
          }
          if (h.kind != wire::frame_kind::welcome || h.source != static_cast<std::uint32_t>(peer))
            throw error(errc::protocol, who + " answered the handshake with an unexpected frame");
          add_link(peer, std::move(*socket));
          --join_pending;
        } catch (const error& e) {
          if (!join_failure) join_failure = e;
        } catch (const std::exception& e) {
          if (!join_failure) join_failure = error(errc::config, "connecting to rank " + std::to_string(peer) + ": " + e.what());
        }
      });
    }

    void hello(tcp::socket& socket) {
      wire::frame_header h;
      h.kind = wire::frame_kind::hello;
      h.token_hash = token;
      h.source = static_cast<std::uint32_t>(options.rank);
      h.tag = static_cast<std::uint64_t>(options.size);  // the world size this rank was started with
      const auto bytes = wire::encode(h);
      boost::asio::write(socket, boost::asio::buffer(bytes));  // 48 bytes into a fresh socket's buffer
    }

    void accept_peers(tcp::acceptor& acceptor) {
      acceptor.async_accept([this, &acceptor](const boost::system::error_code& ec, tcp::socket s) {
        if (ec == boost::asio::error::operation_aborted || !joining) return;
        if (!ec) {
          auto socket = std::make_shared<tcp::socket>(std::move(s));
          auto header = std::make_shared<wire::header_bytes>();
          boost::asio::async_read(*socket, boost::asio::buffer(*header),
                                  [this, socket, header](const boost::system::error_code& ec2, std::size_t) {
                                    // A stranger's hello that completes after the join is just dropped.
                                    if (!ec2 && joining) greet(std::move(*socket), *header);
                                  });
        }
        accept_peers(acceptor);
      });
    }

    // Checks a dialling peer's hello; refuses strangers (wrong token, wrong job size,
    // a rank that is not one of the higher ranks, a duplicate) with a reason, and keeps
    // listening for the real peer.
    void greet(tcp::socket socket, const wire::header_bytes& bytes) {
      std::string refusal;
      int peer = -1;
      try {
        const auto h = wire::decode(bytes, token, "a connecting process");
        peer = static_cast<int>(h.source);
        if (h.kind != wire::frame_kind::hello) throw error(errc::protocol, "expected a hello frame");
        if (h.tag != static_cast<std::uint64_t>(options.size))
          throw error(errc::config, "it was started with world size " + std::to_string(h.tag) + ", this rank with " +
                                        std::to_string(options.size) + ": give every rank the same WORLD_SIZE");
        if (peer <= options.rank || peer >= options.size || links[peer])
          throw error(errc::config, "rank " + std::to_string(peer) + " cannot dial rank " +
                                        std::to_string(options.rank) + " (out of range or already connected)");
      } catch (const error& e) {
        refusal = e.kind() == errc::auth ? "wrong job token: give every rank the same GRADWIRE_JOB_TOKEN" : e.what();
      }
      wire::frame_header reply;
      reply.kind = refusal.empty() ? wire::frame_kind::welcome : wire::frame_kind::refuse;
      reply.token_hash = token;
      reply.source = static_cast<std::uint32_t>(options.rank);
      reply.length = refusal.size();
      const auto header = wire::encode(reply);
      boost::system::error_code ec;
      const std::array<boost::asio::const_buffer, 2> buffers{boost::asio::buffer(header),
                                                             boost::asio::buffer(refusal.data(), refusal.size())};
      boost::asio::write(socket, buffers, ec);  // small: fits the socket buffer
      if (!refusal.empty() || ec) return;       // the socket closes; keep waiting for the real peer
      add_link(peer, std::move(socket));
      --join_pending;
    }

    void add_link(int peer, tcp::socket socket) {
      boost::system::error_code ignored;  // options that do not take leave the defaults
      socket.set_option(tcp::no_delay(true), ignored);
      if (options.socket_buffer_bytes > 0) {
        socket.set_option(boost::asio::socket_base::send_buffer_size(options.socket_buffer_bytes), ignored);
        socket.set_option(boost::asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), ignored);
      }
      watch_link(socket);
      links[peer] = std::make_unique<detail::tcp_link>(std::move(socket), peer);
      links[peer]->address = links[peer]->socket.remote_endpoint(ignored).address().to_string();
      links[peer]->status_out.state = status::done;
      // The stage that chunked receives read through, allocated and touched now, not
      // on the first step (first touch is slow on these machines).
      links[peer]->stage.assign(stage_bytes, std::byte{0});
    }

    // --- operations ------------------------------------------------------------------

    std::unique_ptr<detail::tcp_op> make_op(bool is_send, int peer, std::uint64_t tag, std::byte* data,
                                            std::size_t bytes) {
      if (peer < 0 || peer >= options.size)
        throw error(errc::invalid_argument, "asio_tcp: rank " + std::to_string(options.rank) + " addressed rank " +
                                                std::to_string(peer) + " in a job of " + std::to_string(options.size));
      throw_if_failed();
      auto op = std::make_unique<detail::tcp_op>();
      op->is_send = is_send;
      op->peer = peer;
      op->tag = tag;
      op->data = data;
      op->bytes = bytes;
      return op;
    }

    void post_send(detail::tcp_op& op) {
      if (op.peer == options.rank) return send_to_self(op);
      detail::tcp_link& link = *links[op.peer];
      if (link.finished) return op.finish(errc::peer_lost, finished_message(op.peer));
      if (!link.lost_reason.empty()) return op.finish(errc::peer_lost, link.lost_reason);
      wire::frame_header h;
      h.kind = wire::frame_kind::data;
      h.token_hash = token;
      h.tag = op.tag;
      h.length = op.bytes;
      h.source = static_cast<std::uint32_t>(options.rank);
      if (options.checksum_payload) {
        h.flags = wire::payload_checksummed;
        h.payload_crc = wire::crc32c({op.data, op.bytes});
      }
      op.header = wire::encode(h);
      link.sends.push_back(&op);
      if (!link.writing) write_next(link);
    }

    void post_recv(detail::tcp_op& op) {
      if (op.peer == options.rank) return receive_from_self(op);
      detail::tcp_link& link = *links[op.peer];
      // An earlier arrival with this tag is the message (tags match in arrival order).
      for (auto it = link.arrived.begin(); it != link.arrived.end(); ++it)
        if (it->tag == op.tag) {
          deliver(op, it->payload);
          give_back(std::move(it->payload));
          link.arrived.erase(it);
          return;
        }
      if (link.parked && link.incoming.tag == op.tag) {
        link.parked = false;
        read_payload_into(link, op);
        return;
      }
      if (link.finished) return op.finish(errc::peer_lost, finished_message(op.peer));
      if (!link.lost_reason.empty()) return op.finish(errc::peer_lost, link.lost_reason);
      link.receives.push_back(&op);
    }

    void wait(detail::tcp_op& op, deadline until) {
      if (op.state == status::cancelled)
        throw error(errc::invalid_argument, "asio_tcp: wait on a withdrawn request");
      // Waiting for one message while an earlier, larger one from the same peer waits
      // for its receive would wait forever (its bytes are ahead in the stream): take that
      // one into memory now. Collectives post receives in order, so they never pay this.
      if (!op.is_send && op.state == status::queued && op.peer != options.rank)
        if (auto& link = links[op.peer]; link && link->parked && link->incoming.tag != op.tag) {
          link->parked = false;
          read_eager(*link);
        }
      poll_briefly(op);
      if (op.state != status::done) begin_wait(op.peer);  // going to sleep: the stall watch's business
      const watched_wait watched{*this};
      if (!detail::run_until(io, [&] { return op.state == status::done; }, until)) {
        cancel(op);
        throw error(errc::timeout, detail::timeout_message(options.rank, describe(op)));
      }
      if (op.failure != errc{}) throw error(op.failure, op.message);
    }

    template <class Request>
    std::size_t wait_any(std::span<Request* const> requests, deadline until) {
      std::optional<std::size_t> ready;
      auto find = [&] {
        for (std::size_t i = 0; i < requests.size() && !ready; ++i)
          if (const auto* op = requests[i] ? requests[i]->peek() : nullptr; op && op->state == status::done) ready = i;
        return ready.has_value();
      };
      if (!find()) {
        bool first = true;
        for (auto* r : requests)
          if (const auto* op = r ? r->peek() : nullptr; op && op->state != status::done) {
            begin_wait(op->peer, !std::exchange(first, false));
          }
        const watched_wait watched{*this};
        if (!detail::run_until(io, [&] { return find() || failed.has_value(); }, until))
          throw error(errc::timeout, detail::wait_any_timeout_message(options.rank, requests.size()));
      }
      if (!ready) throw_if_failed();  // the run ended because the rank failed
      return *ready;
    }

    // A peer's answer often comes within microseconds; a sleep in epoll and the wake-up
    // after it cost more than that. With a core per rank, poll for a short while first;
    // oversubscribed, yield the core between polls instead (the peer may need it).
    void poll_briefly(const detail::tcp_op& op) {
      if (options.poll_before_sleep.count() == 0 || op.state == status::done) return;
      const auto stop = clock::now() + (dedicated ? options.poll_before_sleep : options.poll_before_sleep / 4);
      while (op.state != status::done && clock::now() < stop) {
        if (io.stopped()) io.restart();
        if (io.poll() == 0 && !dedicated) std::this_thread::yield();
      }
    }

    // Withdraws an op that will not be waited for. One that Asio is reading into or
    // writing from cannot be taken back mid-frame: its connection is closed, which
    // fails the job (a stream cut mid-frame cannot be resynchronised).
    void cancel(detail::tcp_op& op) noexcept {
      if (op.state == status::done || op.state == status::cancelled) return;
      if (op.peer == options.rank) {
        std::erase(self_receives, &op);
      } else if (auto& link = links[op.peer]) {
        const bool active = op.is_send ? (link->writing && !link->sends.empty() && link->sends.front() == &op)
                                       : link->reading == &op;
        if (active) {
          if (op.is_send) link->sends.pop_front(); else link->reading = nullptr;
          lose(*link, errc::peer_lost, "an operation with rank " + std::to_string(op.peer) +
                                           " was abandoned mid-message (timeout or error)");
        } else {
          std::erase(op.is_send ? link->sends : link->receives, &op);
        }
      }
      op.state = status::cancelled;
    }

    // --- reading ---------------------------------------------------------------------

    void read_header(detail::tcp_link& link) {
      boost::asio::async_read(link.socket, boost::asio::buffer(link.in_header),
                              [this, &link](const boost::system::error_code& ec, std::size_t) {
                                if (ec) return broken(link, ec);
                                on_header(link);
                              });
    }

    void on_header(detail::tcp_link& link) {
      const std::string who = "rank " + std::to_string(link.peer);
      try {
        link.incoming = wire::decode(link.in_header, token, who);
      } catch (const error& e) {
        return lose(link, e.kind(), e.what());
      }
      const auto& h = link.incoming;
      if (h.source != static_cast<std::uint32_t>(link.peer))
        return lose(link, errc::protocol, who + " sent a frame claiming to come from rank " + std::to_string(h.source));
      if (h.kind == wire::frame_kind::abort) {  // the reason follows, as text
        if (h.length > max_abort_bytes) return lose(link, errc::protocol, who + " sent an oversized abort frame");
        return read_eager(link);
      }
      if (h.kind == wire::frame_kind::goodbye) return on_goodbye(link);
      if (h.kind == wire::frame_kind::status) {  // what the peer waits for follows
        if (h.length > max_status_bytes) return lose(link, errc::protocol, who + " sent an oversized status frame");
        return read_eager(link);
      }
      if (h.kind != wire::frame_kind::data)
        return lose(link, errc::protocol, who + " sent an unexpected frame kind " + std::to_string(int(h.kind)));
      for (auto it = link.receives.begin(); it != link.receives.end(); ++it)
        if ((*it)->tag == h.tag) {
          detail::tcp_op& op = **it;
          link.receives.erase(it);
          return read_payload_into(link, op);
        }
      // Small, or large while a receive for a later message already waits on this link
      // (its bytes are behind this one): into memory. Otherwise the message stays in the
      // kernel until its receive is posted (post_recv) or another one is waited for (wait).
      if (h.length <= options.eager_bytes || !link.receives.empty()) return read_eager(link);
      link.parked = true;
    }

    void read_payload_into(detail::tcp_link& link, detail::tcp_op& op) {
      if (op.bytes != link.incoming.length) {
        fail_size(op, link.incoming.length);
        return drain(link, static_cast<std::size_t>(link.incoming.length));  // keeps the stream in step
      }
      op.state = status::active;
      link.reading = &op;
      if (op.deliver != detail::deliver_copy) return read_accumulating(link, 0, 0);
      boost::asio::async_read(link.socket, boost::asio::buffer(op.data, op.bytes),
                              [this, &link](const boost::system::error_code& ec, std::size_t) {
                                if (ec) return broken(link, ec);
                                detail::tcp_op* done = std::exchange(link.reading, nullptr);
                                if (done) {
                                  try {
                                    wire::check_payload(link.incoming, {done->data, done->bytes},
                                                        "rank " + std::to_string(link.peer));
                                    done->finish();
                                  } catch (const error& e) {
                                    done->finish(e.kind(), e.what());
                                    return lose(link, e.kind(), e.what());
                                  }
                                }
                                read_header(link);
                              });
    }

    // Reads link.reading's payload through the link's stage in chunks, adding each into
    // place as it lands, from byte `offset` on; `crc` carries the payload checksum so far.
    void read_accumulating(detail::tcp_link& link, std::size_t offset, std::uint32_t crc) {
      detail::tcp_op& op = *link.reading;
      const std::size_t chunk = std::min(stage_bytes, op.bytes - offset);
      auto on_chunk = [this, &link, offset, crc, chunk](const boost::system::error_code& ec, std::size_t) {
        if (ec) return broken(link, ec);
        detail::tcp_op* op = link.reading;
        if (!op) return;  // withdrawn mid-message: the connection is being closed
        const std::span<const std::byte> piece(link.stage.data(), chunk);
        const std::uint32_t sum = (link.incoming.flags & wire::payload_checksummed) ? wire::crc32c(piece, crc) : crc;
        if (chunk) op->deliver(op->data + offset, piece.data(), chunk);
        if (offset + chunk < op->bytes) return read_accumulating(link, offset + chunk, sum);
        link.reading = nullptr;
        if ((link.incoming.flags & wire::payload_checksummed) && sum != link.incoming.payload_crc) {
          const std::string why = "corrupt payload from rank " + std::to_string(link.peer) + " (tag " +
                                  std::to_string(link.incoming.tag) + "): checksum mismatch";
          op->finish(errc::protocol, why);
          return lose(link, errc::protocol, why);
        }
        op->finish();
        read_header(link);
      };
      if (chunk == 0) return on_chunk({}, 0);
      boost::asio::async_read(link.socket, boost::asio::buffer(link.stage.data(), chunk), on_chunk);
    }

    // Reads and drops `left` payload bytes through the stage, then the next header.
    void drain(detail::tcp_link& link, std::size_t left) {
      if (left == 0) return read_header(link);
      const std::size_t chunk = std::min(stage_bytes, left);
      boost::asio::async_read(link.socket, boost::asio::buffer(link.stage.data(), chunk),
                              [this, &link, left, chunk](const boost::system::error_code& ec, std::size_t) {
                                if (ec) return broken(link, ec);
                                drain(link, left - chunk);
                              });
    }

    void read_eager(detail::tcp_link& link) {
      link.reading_eager.emplace();
      link.reading_eager->tag = link.incoming.tag;
      link.reading_eager->payload = take_buffer(static_cast<std::size_t>(link.incoming.length));
      boost::asio::async_read(link.socket, boost::asio::buffer(link.reading_eager->payload),
                              [this, &link](const boost::system::error_code& ec, std::size_t) {
                                if (ec) return broken(link, ec);
                                detail::arrived_message m = std::move(*link.reading_eager);
                                link.reading_eager.reset();
                                const std::string who = "rank " + std::to_string(link.peer);
                                try {
                                  wire::check_payload(link.incoming, m.payload, who);
                                } catch (const error& e) {
                                  return lose(link, e.kind(), e.what());
                                }
                                if (link.incoming.kind == wire::frame_kind::abort)
                                  return on_abort(link, std::string(reinterpret_cast<const char*>(m.payload.data()),
                                                                    m.payload.size()));
                                if (link.incoming.kind == wire::frame_kind::status) {
                                  const bool fine = on_status(link, m.payload);
                                  give_back(std::move(m.payload));
                                  if (fine) read_header(link);
                                  return;
                                }
                                on_eager(link, std::move(m));
                                read_header(link);
                              });
    }

    void on_eager(detail::tcp_link& link, detail::arrived_message m) {
      // A receive posted while the payload was being read takes it now.
      for (auto it = link.receives.begin(); it != link.receives.end(); ++it)
        if ((*it)->tag == m.tag) {
          detail::tcp_op& op = **it;
          link.receives.erase(it);
          deliver(op, m.payload);
          return give_back(std::move(m.payload));
        }
      link.arrived.push_back(std::move(m));
    }

    // Eager payloads reuse a few buffers instead of allocating per message.
    std::vector<std::byte> take_buffer(std::size_t bytes) {
      std::vector<std::byte> b;
      if (!spare_buffers.empty()) {
        b = std::move(spare_buffers.back());
        spare_buffers.pop_back();
      }
      b.resize(bytes);
      return b;
    }
    void give_back(std::vector<std::byte> b) {
      if (spare_buffers.size() < 16 && b.capacity() <= options.eager_bytes) spare_buffers.push_back(std::move(b));
    }

    void deliver(detail::tcp_op& op, std::span<const std::byte> payload) {
      if (payload.size() != op.bytes) return fail_size(op, payload.size());
      if (!payload.empty()) op.deliver(op.data, payload.data(), payload.size());
      op.finish();
    }

    void fail_size(detail::tcp_op& op, std::uint64_t sent) {
      op.finish(errc::mismatch, detail::size_mismatch_message(op.peer, sent, op.tag, options.rank, op.bytes));
    }

    // The peer finished in good order: what it sent has arrived; what it did not send
    // never will. Receives that nothing arrived for fail, now and later; the rest of
    // the job goes on (it may not need this peer any more).
    void on_goodbye(detail::tcp_link& link) {
      link.finished = true;
      const std::string why = finished_message(link.peer);
      for (auto* op : link.receives) op->finish(errc::peer_lost, why);
      link.receives.clear();
    }

    std::string finished_message(int peer) const {
      return "rank " + std::to_string(options.rank) + ": rank " + std::to_string(peer) +
             " has finished (closed its connection in good order) and will send nothing more";
    }

    void say_goodbye() {
      if (failed) return;
      wire::frame_header h;
      h.kind = wire::frame_kind::goodbye;
      h.token_hash = token;
      h.source = static_cast<std::uint32_t>(options.rank);
      send_to_all_now(h, {});
    }

    // Writes one control frame on every idle connection without waiting and without
    // running any handler (a handler could fail the rank and close sockets midway): a
    // short frame fits an idle socket's buffer, and one that does not is skipped (that
    // peer then sees the connection close instead).
    void send_to_all_now(const wire::frame_header& h, std::span<const std::byte> payload) {
      const wire::header_bytes header = wire::encode(h);
      std::vector<std::byte> frame(header.begin(), header.end());
      frame.insert(frame.end(), payload.begin(), payload.end());
      for (auto& l : links)
        if (l && l->alive && !l->writing) {
          boost::system::error_code ec;
          l->socket.non_blocking(true, ec);
          std::size_t written = 0;
          while (!ec && written < frame.size())
            written += l->socket.write_some(boost::asio::buffer(frame.data() + written, frame.size() - written), ec);
        }
    }

    void on_abort(detail::tcp_link& link, const std::string& reason) {
      const auto cause = static_cast<errc>(link.incoming.tag);
      if (link.tolerated)
        return isolate(link, "rank " + std::to_string(options.rank) + ": lost rank " + std::to_string(link.peer) +
                                 ": it failed: " + reason);
      // A mismatch or a stall timeout stays what it is on every rank; anything else is,
      // to this rank, a lost peer.
      fail_everything(cause == errc::mismatch || cause == errc::timeout ? cause : errc::peer_lost,
                      "rank " + std::to_string(options.rank) + ": rank " + std::to_string(link.peer) +
                          " failed: " + reason);
    }

    // --- writing ---------------------------------------------------------------------

    void write_next(detail::tcp_link& link) {
      if (link.sends.empty() || !link.alive) return;
      detail::tcp_op& op = *link.sends.front();
      op.state = status::active;
      link.writing = true;
      const std::array<boost::asio::const_buffer, 2> buffers{boost::asio::buffer(op.header),
                                                             boost::asio::buffer(op.data, op.bytes)};
      boost::asio::async_write(link.socket, buffers, [this, &link](const boost::system::error_code& ec, std::size_t) {
        link.writing = false;
        if (ec) return broken(link, ec);
        if (!link.sends.empty()) {
          link.sends.front()->finish();
          link.sends.pop_front();
        }
        write_next(link);
      });
    }

    // --- self messages (rank to itself), matched in memory ----------------------------

    void send_to_self(detail::tcp_op& op) {
      std::span<const std::byte> payload(op.data, op.bytes);
      for (auto it = self_receives.begin(); it != self_receives.end(); ++it)
        if ((*it)->tag == op.tag) {
          detail::tcp_op& r = **it;
          self_receives.erase(it);
          deliver(r, payload);
          op.finish(r.failure, r.message);
          return;
        }
      self_arrived.push_back({op.tag, std::vector<std::byte>(payload.begin(), payload.end())});
      op.finish();
    }
    void receive_from_self(detail::tcp_op& op) {
      for (auto it = self_arrived.begin(); it != self_arrived.end(); ++it)
        if (it->tag == op.tag) {
          deliver(op, it->payload);
          self_arrived.erase(it);
          return;
        }
      self_receives.push_back(&op);
    }

    // --- the watch: heartbeats and stalls ------------------------------------------------
    //
    // Heartbeats are the kernel's: TCP keepalive probes every interval on an idle link,
    // and retransmissions or zero-window probes on a busy one, all answered by the peer's
    // kernel, even while the peer's process is stopped. So the time since anything came
    // back from a peer's host (TCP_INFO) stays below about one interval while its host is
    // up, and grows without bound once it is cut off or dead, which no FIN or RST would
    // ever tell. Application heartbeats would need a thread in every rank (progress is
    // made only by the thread that waits) and would take a stopped process for a dead one.
    // The watch is a timer on the rank's io_context, so it runs only while a thread waits
    // there and costs a fast path nothing; a wait that sleeps reads the clock once.

    void watch_link(tcp::socket& socket) {
      if (options.heartbeat_interval.count() == 0) return;
      boost::system::error_code ignored;
      socket.set_option(boost::asio::socket_base::keep_alive(true), ignored);
#if defined(__linux__)
      // TCP_USER_TIMEOUT is left alone: it would also abort a connection to a stopped
      // peer whose receive window stays closed, and that peer is alive.
      const int interval = static_cast<int>(options.heartbeat_interval.count());
      const int count = options.heartbeat_misses + 1;  // the watch decides first; the kernel backs it up
      ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &interval, sizeof interval);
      ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
      ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
    }

    std::chrono::milliseconds heartbeat_limit() const { return options.heartbeat_interval * options.heartbeat_misses; }

    // How often the watch looks: twice per heartbeat interval, and often enough to keep
    // the stall times to within an eighth.
    std::chrono::milliseconds watch_period() const {
      std::chrono::milliseconds p = options.stall_warn / 8;
      if (options.heartbeat_interval.count() > 0) p = std::min(p, std::chrono::milliseconds(options.heartbeat_interval) / 2);
      if (options.stall_timeout.count() > 0) p = std::min(p, options.stall_timeout / 8);
      return std::clamp(p, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
    }

    void start_watch() {
      watch_timer.emplace(io);
      arm_watch();
    }
    void arm_watch() {
      watch_timer->expires_after(watch_period());
      watch_timer->async_wait([this](const boost::system::error_code& ec) {
        if (ec || failed) return;
        if (!aborting) {
          const auto now = clock::now();
          if (options.heartbeat_interval.count() > 0) check_heartbeats();
          if (waiting && !failed) check_stall(now);
        }
        if (!failed) arm_watch();
      });
    }

    // Milliseconds since the peer's host last answered anything (ACKs or data); -1 unknown.
    static long long silence_ms(tcp::socket& socket) {
#if defined(__linux__)
      tcp_info info{};
      socklen_t length = sizeof info;
      if (::getsockopt(socket.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return -1;
      return std::min(info.tcpi_last_ack_recv, info.tcpi_last_data_recv);
#else
      (void)socket;
      return -1;
#endif
    }

    // A peer silent for more than heartbeat_limit() is lost, and with it every peer silent
    // for more than half of it (the other ranks of a host that was cut off, whose silence
    // began at the same moment but was noticed a little later).
    void check_heartbeats() {
      const long long limit = heartbeat_limit().count();
      std::vector<std::pair<int, std::chrono::milliseconds>> silent;
      bool over = false;
      for (auto& l : links)
        if (l && l->alive && !l->finished)
          if (const long long ms = silence_ms(l->socket); ms > limit / 2) {
            silent.emplace_back(l->peer, std::chrono::milliseconds(ms));
            over = over || ms > limit;
          }
      if (!over) return;
      const std::string why = lost_message(silent, false);
      bool all_tolerated = true;
      for (const auto& [peer, ms] : silent) {
        auto& link = *links[peer];
        if (link.tolerated) isolate(link, why);
        else all_tolerated = false;
      }
      if (all_tolerated) return;
      for (const auto& [peer, ms] : silent) links[peer]->alive = false;
      send_abort(errc::peer_lost, why);  // the survivors learn it at once (they detect it too)
      fail_everything(errc::peer_lost, why);
    }

    // "rank 0: lost ranks 2, 3 (host 198.18.0.3): no answer to heartbeats for 5.1 s; ..."
    std::string lost_message(const std::vector<std::pair<int, std::chrono::milliseconds>>& peers, bool by_kernel) const {
      std::vector<std::pair<std::string, std::vector<int>>> hosts;  // in order of first appearance
      std::chrono::milliseconds longest{0};
      for (const auto& [peer, ms] : peers) {
        const std::string& address = links[peer]->address;
        auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return h.first == address; });
        if (it == hosts.end()) it = hosts.insert(hosts.end(), {address, {}});
        it->second.push_back(peer);
        longest = std::max(longest, ms);
      }
      std::string text = "rank " + std::to_string(options.rank) + ": lost ";
      for (std::size_t h = 0; h < hosts.size(); ++h) {
        const auto& ranks = hosts[h].second;
        text += (h ? ", " : "") + std::string(ranks.size() > 1 ? "ranks " : "rank ");
        for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
        text += " (host " + (hosts[h].first.empty() ? std::string("unknown") : hosts[h].first) + ")";
      }
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.1f s", static_cast<double>(longest.count()) / 1000);
      return text + ": no answer to heartbeats " + (by_kernel ? "(the connection timed out)" : "for " + std::string(seconds)) +
             "; a network partition or a dead host (GRADWIRE_HEARTBEAT=" +
             std::to_string(options.heartbeat_interval.count()) + " s, lost after " +
             std::to_string(options.heartbeat_misses) + " silent intervals)";
    }

    // A wait goes to sleep waiting for `peer` (add: one more peer of the same wait).
    void begin_wait(int peer, bool add = false) {
      if (!add) {
        waiting = true;
        wait_began = clock::now();
        waiting_for.clear();
        status_said = warned = false;
      }
      if (std::find(waiting_for.begin(), waiting_for.end(), peer) == waiting_for.end()) waiting_for.push_back(peer);
    }
    void end_wait() noexcept {
      if (!std::exchange(waiting, false) || !status_said || failed) return;
      try {
        send_status(false);  // no longer waiting: the peers forget what this rank said
      } catch (...) {
      }
    }
    struct watched_wait {
      state& s;
      ~watched_wait() { s.end_wait(); }
    };

    // Near the warning time a waiting rank tells its peers what it waits for, so that
    // each can follow the chain of waits to the rank that has said nothing; it warns
    // once; and with a stall timeout it gives up, telling the peers why.
    void check_stall(clock::time_point now) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - wait_began);
      const auto give_up = options.stall_timeout;
      const auto first_word = give_up.count() > 0 ? std::min(options.stall_warn, give_up) : options.stall_warn;
      if (!status_said && waited >= first_word * 3 / 4) {
        status_said = true;
        send_status(true);
      }
      if (!warned && waited >= options.stall_warn && (give_up.count() == 0 || waited < give_up)) {
        warned = true;
        std::vector<int> stalled;
        observe::log_warning(options.rank, options.size, stall_report(waited, stalled));
      }
      if (give_up.count() > 0 && waited >= give_up) {
        std::vector<int> stalled;
        const std::string report = stall_report(waited, stalled);
        std::string names;
        for (std::size_t i = 0; i < stalled.size(); ++i) names += (i ? ", " : "") + std::to_string(stalled[i]);
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", static_cast<double>(give_up.count()) / 1000);
        const std::string why =
            (stalled.empty() ? "no rank is stalled but the ranks wait for each other"
                             : std::string(stalled.size() > 1 ? "ranks " : "rank ") + names + " stalled") +
            " (gave up after GRADWIRE_STALL_TIMEOUT=" + limit + " s): " + report;
        send_abort(errc::timeout, why);
        fail_everything(errc::timeout, why);
      }
    }

    // "rank 0: waited 60.0 s in all_reduce (operation #12, step 40) for rank 1; rank 1 waits
    // for rank 2; rank 2 has said nothing: ..."; `stalled` gets the ranks the chains end at.
    std::string stall_report(std::chrono::milliseconds waited, std::vector<int>& stalled) const {
      const observe::activity& doing = observe::current_activity();
      const std::uint64_t step = observe::current_step().load(std::memory_order_relaxed);
      auto ranks = [](const std::vector<int>& v) {
        std::string t = v.size() > 1 ? "ranks " : "rank ";
        for (std::size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
        return t;
      };
      char head[160];
      std::snprintf(head, sizeof head, "rank %d: waited %.1f s in %s (operation #%llu, step %llu) for ", options.rank,
                    static_cast<double>(waited.count()) / 1000, doing.name ? doing.name : "a transport wait",
                    static_cast<unsigned long long>(doing.operation), static_cast<unsigned long long>(step));
      std::string text = head + ranks(waiting_for);
      // Breadth-first along "waits for" until the ranks that said nothing.
      std::vector<char> seen(links.size(), 0);
      seen[static_cast<std::size_t>(options.rank)] = 1;
      std::deque<int> todo;
      for (int p : waiting_for)
        if (!std::exchange(seen[static_cast<std::size_t>(p)], 1)) todo.push_back(p);
      while (!todo.empty()) {
        const int p = todo.front();
        todo.pop_front();
        const auto& link = links[static_cast<std::size_t>(p)];
        if (link && link->status && !link->status->waits_for.empty()) {
          const auto& st = *link->status;
          text += "; rank " + std::to_string(p) + " waits for " + ranks(st.waits_for);
          if (!st.activity.empty()) text += " (in " + st.activity + ", operation #" + std::to_string(st.operation) + ")";
          for (int q : st.waits_for)
            if (q >= 0 && q < static_cast<int>(seen.size()) && !std::exchange(seen[static_cast<std::size_t>(q)], 1))
              todo.push_back(q);
        } else {
          stalled.push_back(p);
        }
      }
      for (int p : stalled) text += "; rank " + std::to_string(p) + " has said nothing: " + liveness(p);
      if (stalled.empty()) text += "; the ranks wait for each other in a cycle (do all ranks call the same collectives in the same order?)";
      return text;
    }

    std::string liveness(int peer) const {
      const auto& link = links[static_cast<std::size_t>(peer)];
      if (!link || !link->alive) return "its connection is gone";
      if (options.heartbeat_interval.count() > 0) {
        const long long ms = silence_ms(link->socket);
        if (ms >= 0 && ms <= 2 * options.heartbeat_interval.count() * 1000)
          return "it is alive (its host answers) but not calling gradwire (stopped, hung or in a long computation)";
        if (ms >= 0)
          return "its host has not answered for " + std::to_string(ms / 1000) + " s (network trouble?)";
      }
      return "it is connected but not calling gradwire (stopped, hung or in a long computation)";
    }

    // Status frame: tag = operation number; payload = step u64, count u32, the ranks waited
    // for (u32 each), then the activity's name. An empty list: no longer waiting.
    void send_status(bool still_waiting) {
      const observe::activity& doing = observe::current_activity();
      const std::uint64_t step = observe::current_step().load(std::memory_order_relaxed);
      const std::string_view name = doing.name ? doing.name : "";
      const std::uint32_t count = still_waiting ? static_cast<std::uint32_t>(waiting_for.size()) : 0;
      for (auto& l : links) {
        if (!l || !l->alive || l->finished || l->status_out.state != status::done) continue;
        auto& bytes = l->status_bytes;
        bytes.assign(12 + 4 * count + name.size(), std::byte{0});
        wire::detail::put<std::uint64_t>(bytes.data(), step);
        wire::detail::put<std::uint32_t>(bytes.data() + 8, count);
        for (std::uint32_t i = 0; i < count; ++i)
          wire::detail::put<std::uint32_t>(bytes.data() + 12 + 4 * i, static_cast<std::uint32_t>(waiting_for[i]));
        std::memcpy(bytes.data() + 12 + 4 * count, name.data(), name.size());
        wire::frame_header h;
        h.kind = wire::frame_kind::status;
        h.token_hash = token;
        h.tag = doing.operation;
        h.length = bytes.size();
        h.source = static_cast<std::uint32_t>(options.rank);
        detail::tcp_op& op = l->status_out;
        op = detail::tcp_op{};
        op.is_send = true;
        op.peer = l->peer;
        op.data = bytes.data();
        op.bytes = bytes.size();
        op.header = wire::encode(h);
        // Ahead of queued messages (it is about them), behind the one being written.
        l->sends.insert(l->sends.begin() + (l->writing ? 1 : 0), &op);
        if (!l->writing) write_next(*l);
      }
    }

    // False if the frame did not parse (the rank failed).
    bool on_status(detail::tcp_link& link, std::span<const std::byte> payload) {
      const std::string who = "rank " + std::to_string(link.peer);
      auto refuse = [&](const char* what) {
        lose(link, errc::protocol, who + " sent a " + what + " status frame");
        return false;
      };
      if (payload.size() < 12) return refuse("truncated");
      detail::peer_status st;
      st.operation = link.incoming.tag;
      st.step = wire::detail::get<std::uint64_t>(payload.data());
      const auto count = wire::detail::get<std::uint32_t>(payload.data() + 8);
      if (count > links.size() || payload.size() < 12 + 4 * std::size_t{count}) return refuse("malformed");
      for (std::uint32_t i = 0; i < count; ++i)
        st.waits_for.push_back(static_cast<int>(wire::detail::get<std::uint32_t>(payload.data() + 12 + 4 * i)));
      const auto name = payload.subspan(12 + 4 * std::size_t{count});
      st.activity.assign(reinterpret_cast<const char*>(name.data()), name.size());
      link.status = std::move(st);
      return true;
    }

    // --- failure -----------------------------------------------------------------------

    void broken(detail::tcp_link& link, const boost::system::error_code& ec) {
      if (!link.alive || ec == boost::asio::error::operation_aborted) return;
      if (link.finished) {  // it said goodbye and left: only what was still meant for it fails
        link.alive = false;
        for (auto* op : link.sends) op->finish(errc::peer_lost, finished_message(link.peer));
        link.sends.clear();
        return;
      }
      const bool closed = ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset ||
                          ec == boost::asio::error::broken_pipe;
      link.alive = false;
      // The kernel's keepalive gave up (no answer to its probes): a partition or a dead host.
      const std::string why =
          ec == boost::asio::error::timed_out
              ? lost_message({{link.peer, heartbeat_limit()}}, true)
              : "rank " + std::to_string(options.rank) + ": lost rank " + std::to_string(link.peer) + ": " +
                    (closed ? "its connection closed (the process exited or was killed)"
                            : "connection error: " + ec.message());
      if (link.tolerated) return isolate(link, why);
      // A rank that failed for a reason sends abort frames before it exits, but they may
      // arrive on other connections after this one closed: give them a moment, so the
      // rank reports the root cause rather than the echo.
      if (!loss_grace) {
        loss_grace.emplace(io, std::chrono::milliseconds(200));
        loss_grace->async_wait([this, why](const boost::system::error_code&) { fail_everything(errc::peer_lost, why); });
      }
    }

    // A tolerated peer is gone: its operations fail, the rest of the rank goes on.
    void isolate(detail::tcp_link& link, const std::string& why) {
      link.alive = false;
      link.lost_reason = why;
      lost.push_back(link.peer);
      boost::system::error_code ignored;
      link.socket.close(ignored);  // after this, Asio touches none of this link's buffers
      fail_operations(link, errc::peer_lost, why);
      link.writing = false;
      link.parked = false;
    }

    // Finishes every operation queued on or in flight over `link` with `cause`.
    static void fail_operations(detail::tcp_link& link, errc cause, const std::string& why) {
      for (auto* op : link.sends) op->finish(cause, why);
      for (auto* op : link.receives) op->finish(cause, why);
      if (link.reading) link.reading->finish(cause, why);
      link.sends.clear();
      link.receives.clear();
      link.reading = nullptr;
    }

    // A broken connection fails the whole rank: collectives cannot complete without
    // every peer, and failing at once beats waiting for every deadline.
    void lose(detail::tcp_link& link, errc cause, const std::string& why) {
      link.alive = false;
      const std::string what = "rank " + std::to_string(options.rank) + ": " + why;
      if (!failed) send_abort(cause, what);  // so the peers report this, not a closed connection
      fail_everything(cause, what);
    }

    void fail_everything(errc cause, const std::string& why) {
      if (failed || aborting) return;
      failed.emplace(cause, why);
      for (auto& l : links) {
        if (!l) continue;
        boost::system::error_code ignored;
        l->socket.close(ignored);  // after this, Asio touches no buffer of ours again
        fail_operations(*l, cause, why);
        l->alive = false;
      }
      for (auto* op : self_receives) op->finish(cause, why);
      self_receives.clear();
    }

    void abort_all(errc cause, const std::string& reason) {
      if (failed) return;
      // Let writes in flight finish (briefly), so the abort frame can follow them; the
      // rank is failing anyway, so nothing that happens meanwhile may close sockets yet.
      aborting = true;
      detail::run_until(
          io, [&] { return std::none_of(links.begin(), links.end(), [](const auto& l) { return l && l->alive && l->writing; }); },
          deadline_after(std::chrono::milliseconds(200)));
      aborting = false;
      send_abort(cause, reason);
      fail_everything(cause, "rank " + std::to_string(options.rank) + " failed: " + reason);
    }

    // An abort frame with the reason on every idle connection (see send_to_all_now).
    void send_abort(errc cause, const std::string& reason) {
      wire::frame_header h;
      h.kind = wire::frame_kind::abort;
      h.token_hash = token;
      h.tag = static_cast<std::uint64_t>(cause);
      h.source = static_cast<std::uint32_t>(options.rank);
      const std::string text = reason.substr(0, max_abort_bytes);
      h.length = text.size();
      send_to_all_now(h, std::as_bytes(std::span(text.data(), text.size())));
    }

    void throw_if_failed() const {
      if (failed) throw error(failed->first, failed->second);
    }

    static std::string describe(const detail::tcp_op& op) {
      return detail::describe_operation(op.is_send, op.peer, op.tag, op.bytes);
    }

    static constexpr std::size_t stage_bytes = std::size_t{1} << 20;  // chunk of accumulating receives and drains
    static constexpr std::size_t max_abort_bytes = std::size_t{64} << 10;
    static constexpr std::size_t max_status_bytes = 4096;
    asio_tcp_options options;
    std::uint64_t token;
    bool dedicated;  // every local rank can have a core
    boost::asio::io_context io{1};
    // Keeps run_one_until sleeping until its deadline when nothing is outstanding.
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work;
    std::optional<cluster::store_server> store_server;  // rank 0 only
    cluster::topology topology;
    std::vector<std::unique_ptr<detail::tcp_link>> links;  // [peer]; empty for this rank
    std::deque<detail::tcp_op*> self_receives;
    std::deque<detail::arrived_message> self_arrived;
    std::optional<std::pair<errc, std::string>> failed;
    std::vector<std::vector<std::byte>> spare_buffers;
    std::optional<boost::asio::steady_timer> loss_grace;  // running once a connection broke
    std::vector<int> lost;                                // tolerated peers that were lost
    bool aborting = false;
    // The watch (heartbeats, stalls): a timer that runs while a thread waits.
    std::optional<boost::asio::steady_timer> watch_timer;
    // The wait in progress past its polling (begin_wait): whom for and since when.
    bool waiting = false;
    clock::time_point wait_began{};
    std::vector<int> waiting_for;
    bool status_said = false;  // this wait told the peers what it waits for
    bool warned = false;       // this wait logged its stall warning
    // While joining.
    bool joining = false;
    int join_pending = 0;
    std::optional<error> join_failure;
  };

  std::shared_ptr<state> state_;
  traffic_counters traffic_;
};

static_assert(concepts::transport<asio_tcp> && concepts::failable_transport<asio_tcp>);
static_assert(concepts::multiplexing_transport<asio_tcp> && concepts::loss_tolerant_transport<asio_tcp>);
static_assert(concepts::accumulating_transport<asio_tcp, float> && concepts::accumulating_transport<asio_tcp, double>);
static_assert(concepts::metered_transport<asio_tcp>);
static_assert(concepts::topology_aware_transport<asio_tcp>);

}  // namespace gradwire::transport
