// asio_tcp's watch: kernel keepalive heartbeats read through TCP_INFO, stall warnings and reports, status frames.
#pragma once

#if defined(__linux__)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "../../observe/activity.hpp"
#include "../../observe/log.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::watch_link(tcp::socket& socket) {
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

GRADWIRE_DECL std::chrono::milliseconds tcp_engine::heartbeat_limit() const { return options.heartbeat_interval * options.heartbeat_misses; }

// How often the watch looks: twice per heartbeat interval, and often enough to keep
// the stall times to within an eighth.
GRADWIRE_DECL std::chrono::milliseconds tcp_engine::watch_period() const {
  std::chrono::milliseconds p = options.stall_warn / 8;
  if (options.heartbeat_interval.count() > 0) p = std::min(p, std::chrono::milliseconds(options.heartbeat_interval) / 2);
  if (options.stall_timeout.count() > 0) p = std::min(p, options.stall_timeout / 8);
  return std::clamp(p, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
}

GRADWIRE_DECL void tcp_engine::start_watch() {
  watch_timer.emplace(io);
  arm_watch();
}

GRADWIRE_DECL void tcp_engine::arm_watch() {
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
GRADWIRE_DECL long long tcp_engine::silence_ms(tcp::socket& socket) {
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
GRADWIRE_DECL void tcp_engine::check_heartbeats() {
  const long long limit = heartbeat_limit().count();
  std::vector<std::pair<int, std::chrono::milliseconds>> silent;
  bool over = false;
  for (auto& l : links)
    if (l && l->alive && !l->state.finished)
      if (const long long ms = silence_ms(l->socket); ms > limit / 2) {
        silent.emplace_back(l->peer, std::chrono::milliseconds(ms));
        over = over || ms > limit;
      }
  if (!over) return;
  const std::string why = lost_message(silent, false);
  bool all_tolerated = true;
  for (const auto& [peer, ms] : silent) {
    auto& link = *links[peer];
    if (link.state.tolerated) isolate(link, why);
    else all_tolerated = false;
  }
  if (all_tolerated) return;
  for (const auto& [peer, ms] : silent) links[peer]->alive = false;
  send_abort(errc::peer_lost, why);  // the survivors learn it at once (they detect it too)
  fail_everything(errc::peer_lost, why);
}

// "rank 0: lost ranks 2, 3 (host 198.18.0.3): no answer to heartbeats for 5.1 s; ..."
GRADWIRE_DECL std::string tcp_engine::lost_message(const std::vector<std::pair<int, std::chrono::milliseconds>>& peers, bool by_kernel) const {
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
  return text + ": " + heartbeat_loss_reason(longest, by_kernel);
}

// "no answer to heartbeats for 5.1 s; a network partition or a dead host (...)"
GRADWIRE_DECL std::string tcp_engine::heartbeat_loss_reason(std::chrono::milliseconds silent, bool by_kernel) const {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s", static_cast<double>(silent.count()) / 1000);
  return std::string("no answer to heartbeats ") + (by_kernel ? "(the connection timed out)" : "for " + std::string(seconds)) +
         "; a network partition or a dead host (GRADWIRE_HEARTBEAT=" +
         std::to_string(options.heartbeat_interval.count()) + " s, lost after " +
         std::to_string(options.heartbeat_misses) + " silent intervals)";
}

// A wait goes to sleep waiting for `peer` (add: one more peer of the same wait).
GRADWIRE_DECL void tcp_engine::begin_wait(int peer, bool add) {
  if (!add) {
    waiting = true;
    stall.begin(clock::now());
    waiting_for.clear();
  }
  if (std::find(waiting_for.begin(), waiting_for.end(), peer) == waiting_for.end()) waiting_for.push_back(peer);
}

GRADWIRE_DECL void tcp_engine::end_wait() noexcept {
  if (!std::exchange(waiting, false) || !stall.told() || failed) return;
  try {
    send_status(false);  // no longer waiting: the peers forget what this rank said
  } catch (...) {
  }
}

// Near the warning time a waiting rank tells its peers what it waits for, so that
// each can follow the chain of waits to the rank that has said nothing; it warns
// once; and with a stall timeout it gives up, telling the peers why.
GRADWIRE_DECL void tcp_engine::check_stall(clock::time_point now) {
  const auto waited = stall.waited(now);
  const stall_watch::due due = stall.check(now);
  if (due.tell) send_status(true);
  if (due.warn) {
    std::vector<int> stalled;
    observe::log_warning(options.rank, options.size, stall_report(waited, stalled));
  }
  if (due.give_up) {
    std::vector<int> stalled;
    const std::string report = stall_report(waited, stalled);
    const std::string why = stalled_message(stalled, stall.gave_up_text()) + ": " + report;
    send_abort(errc::timeout, why);
    fail_everything(errc::timeout, why);
  }
}

// "rank 0: waited 60.0 s in all_reduce (operation #12, step 40) for rank 1; rank 1 waits
// for rank 2; rank 2 has said nothing: ..."; `stalled` gets the ranks the chains end at.
GRADWIRE_DECL std::string tcp_engine::stall_report(std::chrono::milliseconds waited, std::vector<int>& stalled) const {
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
      for (int q : st.waits_for)  // ranks of the job: on_status refused any other
        if (!std::exchange(seen[static_cast<std::size_t>(q)], 1)) todo.push_back(q);
    } else {
      stalled.push_back(p);
    }
  }
  for (int p : stalled) text += "; rank " + std::to_string(p) + " has said nothing: " + liveness(p);
  if (stalled.empty()) text += "; the ranks wait for each other in a cycle (do all ranks call the same collectives in the same order?)";
  return text;
}

GRADWIRE_DECL std::string tcp_engine::liveness(int peer) const {
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

}  // namespace gradwire::transport::detail
