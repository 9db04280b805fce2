// asio_tcp's engine: the state of one rank's connections, declared here; each job's members are defined in its own .ipp file.
//
// join.ipp (joining), rejoin.ipp (a lost peer's replacement), send.ipp (the send path),
// receive.ipp (the receive path), wait.ipp (waiting and withdrawing), control.ipp (goodbye,
// abort and status frames), failure.ipp (peer loss: the grace, isolating a tolerated peer,
// failing the rank), watch.ipp (heartbeats, stalls); ucx/ names the same jobs the same
// way. What every network
// transport shares (making ops, wait, wait_any, the rank's failure) comes from
// detail/network_engine.hpp; the public class is transport/asio_tcp.hpp.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../rendezvous/store.hpp"
#include "../../support/asio.hpp"
#include "../../support/waiting.hpp"
#include "../../timeouts.hpp"
#include "../detail/join.hpp"
#include "../detail/messages.hpp"
#include "../detail/network_engine.hpp"
#include "../detail/stall_watch.hpp"
#include "../wire.hpp"
#include "peer.hpp"
#include "options.hpp"

namespace gradwire::transport::detail {

struct tcp_engine : network_engine<tcp_engine, tcp_op> {
  using status = tcp_op::status;
  using tcp = support::tcp;
  static constexpr const char* name = "asio_tcp";

  explicit tcp_engine(const asio_tcp_options& o)
      : options(o),
        token(wire::token_hash(o.job_token)),
        dedicated(support::cpu_per_rank(o.local_size)),
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
    if (o.chunk_bytes == 0 || o.chunk_bytes % 16 || o.early_bytes % 16)
      throw error(errc::config, "asio_tcp: chunk_bytes must be a positive multiple of 16 and early_bytes a multiple "
                                "of 16 (whole elements of every type), got " + std::to_string(o.chunk_bytes) + " and " +
                                std::to_string(o.early_bytes));
    waiting_for.reserve(links.size());
  }
  ~tcp_engine() {
    for (auto& l : links)
      if (l) {
        boost::system::error_code ignored;
        l->socket.close(ignored);
      }
  }

  // --- the shared wait's hooks (wait.ipp) -------------------------------------
  // Ends the stall watch's business with a wait when the wait ends.
  struct watched_wait {
    tcp_engine& s;
    ~watched_wait() { s.end_wait(); }
  };
  watched_wait prepare_wait(tcp_op& op);
  bool progress(tcp_op& op, deadline until);
  template <class Find, class Done, class Request>
  bool wait_for_any(Find& find, Done& done, std::span<Request* const> requests, deadline until);
  void settled(tcp_op&) noexcept {}
  const std::string& failure_text(const tcp_op& op) const { return op.message; }
  void tolerate(int peer);
  void allow_rejoin(int peer);

  // --- join.ipp: joining ------------------------------------------------------
  void join();
  tcp::acceptor meet(rendezvous::store_client& store, const join_deadline& time, int learn,
                     std::vector<std::pair<std::string, std::uint16_t>>& addresses, bool publish_first);
  void publish(rendezvous::store_client& store, const join_deadline& time, const tcp::acceptor& acceptor);
  void dial(int peer, const std::pair<std::string, std::uint16_t>& address, deadline until);
  void hello(tcp::socket& socket);
  void check_welcome(int peer, tcp::socket& socket, const wire::header_bytes& reply, const boost::system::error_code& ec);
  template <class Refused>
  void await_welcome(int peer, std::shared_ptr<tcp::socket> socket, Refused refused);
  void accept_peers(tcp::acceptor& acceptor);
  void greet(tcp::socket socket, const wire::header_bytes& bytes);
  void add_link(int peer, tcp::socket socket);
  bool answer_hello(tcp::socket& socket, const std::string& refusal);

  // --- rejoin.ipp: a lost peer's replacement links again ----------------------
  void keep_listening(tcp::acceptor acceptor);
  void accept_rejoins();
  void take_back(tcp::socket socket, const wire::header_bytes& bytes);
  void relink(int peer, tcp::socket socket);
  void join_back();
  void dial_back(int peer, const std::pair<std::string, std::uint16_t>& address, deadline until);
  void mark_absent(int peer, const std::string& why);

  // --- send.ipp: the send path ------------------------------------------------
  void post_send(tcp_op& op);
  void write_next(tcp_link& link);
  bool write_now(tcp_link& link, tcp_op& op);
  void send_to_self(tcp_op& op);

  // --- receive.ipp: the receive path ------------------------------------------
  void post_recv(tcp_op& op);
  void read_frames(tcp_link& link);
  void on_frames(tcp_link& link);
  bool accept_header(tcp_link& link, std::span<const std::byte> bytes);
  bool on_buffered_frame(tcp_link& link, std::span<const std::byte> payload);
  void on_large_frame(tcp_link& link);
  void read_ahead(tcp_link& link);
  void resume_parked(tcp_link& link, tcp_op& op);
  void read_in_place(tcp_link& link, std::size_t offset);
  void read_accumulating(tcp_link& link, std::size_t offset, std::uint32_t crc, std::size_t carried);
  void drain(tcp_link& link, std::size_t left);
  void read_eager(tcp_link& link);
  void on_eager(tcp_link& link, arrived_message m);
  std::vector<std::byte> take_buffer(std::size_t bytes);
  void give_back(std::vector<std::byte> b);
  tcp_op* take_receive(tcp_link& link, std::uint64_t tag);
  void deliver(tcp_op& op, std::span<const std::byte> payload);
  void fail_size(tcp_op& op, std::uint64_t sent);
  void receive_from_self(tcp_op& op);

  // --- wait.ipp: waiting and withdrawing --------------------------------------
  void poll_briefly(const tcp_op& op);
  void cancel(tcp_op& op) noexcept;

  // --- control.ipp, failure.ipp: control frames, peer loss and failure --------
  void on_goodbye(tcp_link& link);
  void say_goodbye();
  void send_to_all_now(const wire::frame_header& h, std::span<const std::byte> payload);
  void on_abort(tcp_link& link, const std::string& reason);
  void broken(tcp_link& link, const boost::system::error_code& ec);
  void await_loss_reason(int extensions);
  void fail_from_loss();
  void isolate(tcp_link& link, const std::string& why, bool gone = false);
  static void fail_operations(tcp_link& link, errc cause, const std::string& why);
  void lose(tcp_link& link, errc cause, const std::string& why);
  void fail_everything(errc cause, const std::string& why);
  void abort_all(errc cause, const std::string& reason);
  void send_abort(errc cause, const std::string& reason, int lost_rank = -1);

  // --- watch.ipp, control.ipp: heartbeats, stalls, status frames --------------
  void watch_link(tcp::socket& socket);
  std::chrono::milliseconds heartbeat_limit() const;
  std::chrono::milliseconds watch_period() const;
  void start_watch();
  void arm_watch();
  static long long silence_ms(tcp::socket& socket);
  void check_heartbeats();
  std::string lost_message(const std::vector<std::pair<int, std::chrono::milliseconds>>& peers, bool by_kernel) const;
  std::string heartbeat_loss_reason(std::chrono::milliseconds silent, bool by_kernel) const;
  void begin_wait(int peer, bool add = false);
  void end_wait() noexcept;
  void check_stall(clock::time_point now);
  std::string stall_report(std::chrono::milliseconds waited, std::vector<int>& stalled) const;
  std::string liveness(int peer) const;
  void send_status(bool still_waiting);
  bool on_status(tcp_link& link, std::span<const std::byte> payload);

  static std::string describe(const tcp_op& op) {
    return describe_operation(op.is_send, op.peer, op.tag, op.bytes);
  }

  static constexpr std::size_t max_abort_bytes = std::size_t{64} << 10;
  static constexpr std::size_t max_status_bytes = 4096;
  // Each link reads through a buffer of frame_buffer_bytes; a frame whose payload is at
  // most buffered_payload_bytes is completed there (then copied into place), a longer
  // one is read into place once the buffered part of it is (docs/perf/tcp.md).
  static constexpr std::size_t frame_buffer_bytes = std::size_t{64} << 10;
  static constexpr std::size_t buffered_payload_bytes = std::size_t{16} << 10;
  asio_tcp_options options;
  std::uint64_t token;
  bool dedicated;           // every local rank can have a CPU
  support::spin_gate spin;  // whether a wait polls hot before it sleeps (wait.ipp, poll_briefly)
  boost::asio::io_context io{1};
  // Keeps run_one_until sleeping until its deadline when nothing is outstanding.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work;
  std::optional<rendezvous::store_server> store_server;  // rank 0 only
  std::vector<std::unique_ptr<tcp_link>> links;  // [peer]; empty for this rank
  std::deque<tcp_op*> self_receives;
  std::deque<arrived_message> self_arrived;
  std::vector<std::vector<std::byte>> spare_buffers;
  std::optional<boost::asio::steady_timer> loss_grace;  // running once a connection broke
  int loss_peer = -1;  // the first peer whose connection broke: suspected (its link's state) while loss_grace runs
  bool aborting = false;
  // The watch (heartbeats, stalls): a timer that runs while a thread waits.
  std::optional<boost::asio::steady_timer> watch_timer;
  // The wait in progress past its polling (begin_wait): whom for and since when.
  bool waiting = false;
  stall_watch stall{options.stall_warn, options.stall_timeout};
  std::vector<int> waiting_for;
  // While joining.
  bool joining = false;
  int join_pending = 0;
  std::optional<error> join_failure;
  // After the join: the listening socket, kept so that a lost peer's replacement can
  // link again (rejoin.ipp); links it replaced, kept until the engine goes (Asio may
  // still hold handlers that name them); how many peers came back.
  std::optional<tcp::acceptor> listener;
  std::string reachable_host;  // where the peers reach this rank's listener (meet)
  static constexpr std::chrono::seconds hello_timeout{10};
  std::vector<std::unique_ptr<tcp_link>> replaced_links;
  int rejoined_peers = 0;
};

// The shared wait_any's hook: a template over the request type, so it is defined here, not in wait.ipp.
template <class Find, class Done, class Request>
bool tcp_engine::wait_for_any(Find& find, Done& done, std::span<Request* const> requests, deadline until) {
  if (find()) return true;
  bool first = true;
  for (auto* r : requests)
    if (const auto* op = r ? r->peek() : nullptr; op && op->state != status::done) {
      begin_wait(op->peer, !std::exchange(first, false));
    }
  const watched_wait watched{*this};
  return support::run_until(io, done, until);
}

}  // namespace gradwire::transport::detail
