// ucx's engine: one rank's UCP worker, endpoints and ops, declared here; each job's members are defined in its own file.
//
// join.ipp (joining, endpoints), rejoin.ipp (a lost peer's replacement), worker.ipp (the UCP context and worker), wait.ipp
// (progress, flush, settle), send.ipp, receive.ipp, one_sided.hpp/.ipp (windows, put and
// get), control.ipp (goodbye and abort), failure.ipp (peer loss, failing the rank,
// withdrawing ops), watch.ipp (stall warning and timeout), support.hpp (UCP handles, tags);
// tcp/ names the same jobs the same way. What every network
// transport shares (making ops, wait, wait_any, the rank's failure) comes from
// detail/network_engine.hpp; the public class is transport/ucx.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../rendezvous/store.hpp"
#include "../../support/waiting.hpp"
#include "../../timeouts.hpp"
#include "../detail/messages.hpp"
#include "../detail/network_engine.hpp"
#include "../detail/stall_watch.hpp"
#include "support.hpp"
#include "options.hpp"
#include "peer.hpp"

namespace gradwire::transport {
class ucx;
}  // namespace gradwire::transport

namespace gradwire::transport::detail {

class ucx_memory_window;
class ucx_remote_window;

struct ucx_engine : network_engine<ucx_engine, ucx_op> {
  using status = ucx_op::status;
  static constexpr const char* name = "ucx";

  explicit ucx_engine(const ucx_options& o)
      : options(o), dedicated(support::cpu_per_rank(o.local_size)) {
    if (o.size < 1) throw error(errc::config, "ucx: world size must be >= 1, got " + std::to_string(o.size));
    if (o.size > ucx_tag::max_ranks)
      throw error(errc::config, "ucx: at most " + std::to_string(ucx_tag::max_ranks) + " ranks, got " +
                                    std::to_string(o.size));
    if (o.rank < 0 || o.rank >= o.size)
      throw error(errc::config, "ucx: rank " + std::to_string(o.rank) + " is outside 0.." + std::to_string(o.size - 1));
    if (o.stall_warn.count() <= 0 || o.stall_timeout.count() < 0)
      throw error(errc::config, "ucx: stall_warn must be > 0 and stall_timeout >= 0 (0: off)");
    peers.resize(static_cast<std::size_t>(o.size));
    topology = cluster::topology::one_host(o.size);  // until join() learns better
    open_worker();
  }
  ~ucx_engine() {
    close_endpoints();
    worker.reset();
    context.reset();
  }

  // --- the shared wait's hooks --------------------------------------------------
  struct no_watch {};
  no_watch prepare_wait(ucx_op&) noexcept { return {}; }
  bool progress(ucx_op& op, deadline until) {
    return progress_until([&] { return op.state == status::done; }, until, op.peer);
  }
  template <class Find, class Done, class Request>
  bool wait_for_any(Find&, Done& done, std::span<Request* const>, deadline until) {
    return progress_until(done, until);
  }
  void settled(ucx_op& op) noexcept { forget(op); }
  std::string failure_text(const ucx_op& op) const { return op.message.empty() ? why_failed(op) : op.message; }
  // Every transport's tag limit; only the join may use the tag at it (its greetings).
  static_assert(ucx_tag::join_tag == tag_limit, "the join's tag is the one at every transport's limit");
  void check_tag(std::uint64_t tag) const {
    if (!(joining && tag == ucx_tag::join_tag)) detail::check_tag(name, tag);
  }
  void tolerate(int peer) { peers[peer].state.tolerated = true; }

  // --- join.ipp: joining, endpoints -------------------------------------------
  void join();
  void greet_everyone(deadline until);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void check_published_address(int r, const std::vector<std::byte>& address) const;
  ucp_ep_h connect(int peer, const std::vector<std::byte>& address, bool error_handling);
  void close_endpoint(ucx_peer& p) noexcept;
  void close_endpoint(ucp_ep_h ep) noexcept;
  void close_endpoints() noexcept;

  // --- rejoin.ipp: a lost peer's replacement connects again --------------------
  void allow_rejoin(int peer);
  void join_back(deadline until);
  void take_back(int peer, std::span<const std::byte> address);
  void answer_rejoin(int peer, ucp_ep_h ep, ucx_control kind, const std::string& text, bool retryable);
  void relink(int peer, std::span<const std::byte> address);
  void discard_stale_messages(int peer);
  void mark_absent(int peer, const std::string& why);
  void peer_address(int peer, std::span<const std::byte> address);

  // --- worker.ipp, wait.ipp, watch.ipp: the worker, progress, stalls ----------
  void open_worker();
  std::vector<std::byte> worker_address();
  void settle(ucx_op& op) noexcept;
  void warn_stall(clock::duration waited, int peer) const;
  std::string stall_text(clock::duration waited, int peer) const;
  unsigned progress_once();
  template <class Done>
  bool progress_until(Done&& done, deadline until, int peer = -1);
  void handle_events();
  void flush(deadline until);

  // --- send.ipp: the send path ------------------------------------------------
  bool peer_unavailable(ucx_op& op);
  static void on_send_done(void* request, ucs_status_t status, void* user_data);
  void post_send(ucx_op& op);
  void track(ucx_op& op, ucs_status_ptr_t r);

  // --- receive.ipp: the receive path ------------------------------------------
  static void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void finish_receive(ucx_op* op, ucs_status_t status, std::size_t length);
  void post_recv(ucx_op& op);

  // --- one_sided.hpp: windows, put and get ------------------------------------
  ucx_memory_window expose(const std::shared_ptr<ucx_engine>& self, std::span<std::byte> memory);
  ucx_remote_window attach(const std::shared_ptr<ucx_engine>& self, int peer, std::span<const std::byte> key);
  void release_rkey(int peer, ucp_rkey_h rkey) noexcept;
  std::unique_ptr<ucx_op> make_one_sided_op(const ucx_remote_window& w, std::size_t offset, std::byte* data,
                                                    std::size_t bytes, const char* what);
  void post_one_sided(ucx_op& op, const ucx_remote_window& w, std::uint64_t remote, bool put);

  // --- control.ipp: goodbye and abort -----------------------------------------
  static void on_control_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  void post_control_receive();
  void on_control();
  void on_goodbye(int peer);
  void fail_receives_from(int peer);
  void send_control(ucx_control kind, errc cause, const std::string& text, deadline until, int only = -1,
                    int lost_rank = -1);
  void fail_from_loss(int peer);
  bool listening(int peer) const;
  void await_abort_seen(deadline until);
  void say_goodbye();
  void abort_all(errc cause, const std::string& reason);
  void abort_with(errc cause, const std::string& told, int lost_rank, const std::string& report);
  void give_up_stall(clock::duration waited, int peer);

  // --- failure.ipp: peer loss, failure, withdrawing ---------------------------
  void complete_failure(ucx_op& op, errc cause, const std::string& why);
  void cancel(ucx_op& op) noexcept;
  void withdraw(ucx_op& op, errc cause, const std::string& why) noexcept;
  void forget(ucx_op& op) noexcept;
  // The sends (and puts) in flight to `peer`: what a finished peer's break settles.
  std::vector<ucx_op*> sends_to(int peer) const;
  void on_broken(int peer, ucs_status_t s);
  void isolate(int peer, const std::string& why, bool gone = false);
  void fail_everything(errc cause, const std::string& why);
  std::string why_failed(const ucx_op& op) const;

  static std::string describe(const ucx_op& op) {
    if (op.one_sided) return std::string(op.what) + " rank " + std::to_string(op.peer) + " (" + std::to_string(op.bytes) + " bytes)";
    return describe_operation(op.is_send, op.peer, op.tag, op.bytes);
  }

  static constexpr std::size_t max_control_bytes = std::size_t{64} << 10;
  static constexpr std::size_t control_header_bytes = 16;  // sender, kind, cause, 1 + lost rank (control.ipp)
  static constexpr std::size_t address_header = sizeof(std::uint32_t) + sizeof(std::uint64_t);
  ucx_options options;
  bool dedicated;
  // Whether a wait polls hot (no yield) for its window; a closed gate polls the window
  // yielding instead (support/waiting.hpp; ucx shared memory, 2 unbound ranks on the
  // loaded 2-core VM, 4 B: 121 us hot against 6.4 us yielding, and quiet 1.06 against
  // 1.9: docs/perf/ucx_sm.md).
  support::spin_gate spin;
  ucp_context_ptr context;
  ucp_worker_ptr worker;
  int event_fd = -1;
  std::optional<rendezvous::store_server> store_server;  // rank 0 only
  std::vector<ucx_peer> peers;
  std::vector<ucx_op*> in_flight;  // ops UCX holds a request for
  bool said_goodbye = false;
  bool aborting = false;  // abort_all waits for the peers' abort_seen
  stall_watch stall{options.stall_warn, options.stall_timeout};  // the wait in progress past its polling
  bool joining = true;  // only the join may use ucx_tag::join_tag
  bool rejoining = false;  // a replacement's join: it reads its peers' answers (control messages)
  int rejoined_peers = 0;  // peers whose replacements were taken back
  // The standing receive for control messages, and what its callback saw.
  std::vector<std::byte> control_buffer;
  void* control_request = nullptr;
  bool control_arrived = false;
  std::size_t control_length = 0;
  struct broken_endpoint {
    int peer;
    ucs_status_t status;
    ucp_ep_h ep;  // a report about an endpoint since replaced (rejoin) is dropped
  };
  std::vector<broken_endpoint> broken_endpoints;  // from the error callback
  // Ops UCX would not let go of in time (a rejoin's answer, a stale message's receive),
  // with their buffers: kept until the worker is gone, which releases them.
  std::vector<std::pair<std::unique_ptr<ucx_op>, std::vector<std::byte>>> stranded;
  void keep_until_released(std::unique_ptr<ucx_op> op, std::vector<std::byte> buffer) {
    if (op->request) stranded.emplace_back(std::move(op), std::move(buffer));
  }
};

// A template over the condition, so it is defined here, not in wait.ipp.
// `peer`: the rank waited for, named if the wait lasts options.stall_warn (-1: several).
template <class Done>
bool ucx_engine::progress_until(Done&& done, deadline until, int peer) {
  const auto began = clock::now();
  const auto poll_stop = began + support::poll_window(options.poll_before_sleep, dedicated);
  // Hot polling (no yield) while the spin gate says it pays.
  const bool hot = dedicated && spin.open();
  bool sleeping = false, missed = false;
  for (;;) {
    progress_once();
    if (done()) {
      if (hot && !missed) spin.spun(true);  // answered inside the window
      return true;
    }
    const auto now = clock::now();
    if (now >= until) return false;
    if (now < poll_stop) {
      if (!hot) std::this_thread::yield();
      continue;
    }
    if (hot && !std::exchange(missed, true)) spin.spun(false);
    if (!std::exchange(sleeping, true)) stall.begin(began);
    // Sleeping waits wake every keepalive_wake; the join has its own timeout naming the
    // ranks that did not connect.
    const stall_watch::due due = joining ? stall_watch::due{} : stall.check(now);
    if (due.warn) warn_stall(now - began, peer);
    if (due.give_up && !failed) {
      give_up_stall(now - began, peer);
      return done();
    }
    const ucs_status_t armed = ucp_worker_arm(worker.get());
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them
    ucx_check(armed, "ucp_worker_arm");
    auto sleep = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
                              std::chrono::milliseconds(1),
                          options.keepalive_wake);
    if (options.stall_timeout.count() > 0 && !joining)
      sleep = std::min(sleep, std::max(options.stall_timeout - stall.waited(now), std::chrono::milliseconds(0)) +
                                  std::chrono::milliseconds(1));
    for (const auto& p : peers)
      if (p.state.suspected())
        sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(*p.state.suspected_until - now) +
                                    std::chrono::milliseconds(1));
    wait_for_event(event_fd, sleep);
  }
}

}  // namespace gradwire::transport::detail
