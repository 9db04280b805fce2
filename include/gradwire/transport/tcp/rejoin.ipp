// asio_tcp after the join: a lost peer's replacement process links again (rejoin), on both sides.
//
// Every rank keeps its listening socket after its join, a replacement too (it publishes its
// new address, so that a later replacement of another rank finds it). A hello that arrives
// after the join is a replacement for a lost peer: a rank takes it back
// when it allowed that peer to rejoin (allow_rejoin: an asynchronous parameter server's
// servers, for their workers) and has lost it, and refuses it with the reason otherwise. The replacement (options.rejoin)
// dials every peer: those that take it back are linked, the rest stay unlinked, and
// operations with them fail with peer_lost naming the reason. Receives a rank posts
// from a lost peer that may rejoin wait for its replacement (or their deadline).
#pragma once

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <poll.h>
#include <utility>
#include <vector>

#include "../../observe/log.hpp"
#include "../../rendezvous/host_identity.hpp"
#include "../../rendezvous/store.hpp"
#include "../../support/asio.hpp"
#include "../detail/join.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::allow_rejoin(int peer) {
  if (auto& link = links[peer]) link->state.tolerated = link->rejoinable = true;
}

GRADWIRE_DECL void tcp_engine::keep_listening(tcp::acceptor acceptor) {
  boost::system::error_code ignored;
  acceptor.cancel(ignored);  // the join's own accept ends (its handler sees operation_aborted)
  listener.emplace(std::move(acceptor));
  accept_rejoins();
}

// A connection must say hello within hello_timeout (a probe or a stranger that says
// nothing is closed); an accept that fails (out of descriptors) is retried after a pause
// rather than at once.
GRADWIRE_DECL void tcp_engine::accept_rejoins() {
  listener->async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      auto pause = std::make_shared<boost::asio::steady_timer>(io, std::chrono::milliseconds(100));
      pause->async_wait([this, pause](const boost::system::error_code& e) {
        if (e != boost::asio::error::operation_aborted && listener) accept_rejoins();
      });
      return;
    }
    auto socket = std::make_shared<tcp::socket>(std::move(s));
    auto header = std::make_shared<wire::header_bytes>();
    auto timer = std::make_shared<boost::asio::steady_timer>(io, hello_timeout);
    timer->async_wait([socket](const boost::system::error_code& e) {
      boost::system::error_code ignored;
      if (e != boost::asio::error::operation_aborted) socket->close(ignored);
    });
    boost::asio::async_read(*socket, boost::asio::buffer(*header),
                            [this, socket, header, timer](const boost::system::error_code& ec2, std::size_t) {
                              timer->cancel();
                              if (!ec2) take_back(std::move(*socket), *header);
                            });
    accept_rejoins();
  });
}

namespace tcp_rejoin {
// Whether the peer's end of `socket` is closed (it exited or was killed) although this
// rank has not read to the end yet: a replacement's hello can arrive before the old
// connection's end is handled. POLLRDHUP reports the peer's FIN even behind unread data
// (a killed worker's half-sent push).
GRADWIRE_DECL bool closed_by_peer(tcp::socket& socket) {
  pollfd p{socket.native_handle(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}
}  // namespace tcp_rejoin

// A hello after the join: takes a lost peer's replacement back, or refuses with why.
GRADWIRE_DECL void tcp_engine::take_back(tcp::socket socket, const wire::header_bytes& bytes) {
  std::string refusal;
  int peer = -1;
  const std::string me = "rank " + std::to_string(options.rank);
  try {
    const auto h = wire::decode(bytes, token, "a connecting process");
    if (h.kind != wire::frame_kind::hello) throw error(errc::protocol, "expected a hello frame");
    if (h.tag != static_cast<std::uint64_t>(options.size))
      throw error(errc::config, world_size_mismatch_message(h.source, h.tag, options.rank, options.size));
    if (h.source >= static_cast<std::uint32_t>(options.size) || static_cast<int>(h.source) == options.rank)
      throw error(errc::config, "rank " + std::to_string(h.source) + " is not a peer of " + me);
    peer = static_cast<int>(h.source);
    const std::string who = "rank " + std::to_string(peer);
    if (failed) throw error(errc::peer_lost, me + " has failed: " + failed->second);
    tcp_link* link = links[peer].get();
    if (!link || !link->rejoinable)
      throw error(errc::config, me + " does not take " + who + " back after the job started (only an asynchronous "
                                     "parameter server's servers take lost workers back)");
    if (link->state.finished)
      throw error(errc::config, who + " has finished (it said goodbye): it cannot rejoin");
    if (link->alive && tcp_rejoin::closed_by_peer(link->socket))
      broken(*link, boost::asio::error::eof);  // isolates it: it is tolerated
    if (link->alive)
      throw error(errc::config, who + " is still connected to " + me + ": are two processes running as " + who + "?");
  } catch (const error& e) {
    refusal = e.kind() == errc::auth ? "wrong job token: give every rank the same GRADWIRE_JOB_TOKEN" : e.details();
  }
  if (!answer_hello(socket, refusal)) return;
  relink(peer, std::move(socket));
  observe::log_info(options.rank, options.size, "asio_tcp: rank ", peer, " rejoined (a replacement process)");
}

// Links `peer`'s replacement in place of the lost link; the receives that waited for it
// move over.
GRADWIRE_DECL void tcp_engine::relink(int peer, tcp::socket socket) {
  std::unique_ptr<tcp_link> old = std::move(links[peer]);
  add_link(peer, std::move(socket));
  tcp_link& link = *links[peer];
  link.state.tolerated = link.rejoinable = true;
  link.receives = std::move(old->receives);
  old->receives.clear();
  replaced_links.push_back(std::move(old));
  std::erase(lost, peer);
  std::erase(gone, peer);
  ++rejoined_peers;
  read_frames(link);
}

// The replacement's join: no store of its own (rank 0 serves it and cannot rejoin); it
// listens, says hello to every peer at once, and once a peer has taken it back (proof that
// the process it replaces is gone) publishes its address in place of that process's, where
// a later replacement of another rank dials it. (A stray second process as a live rank,
// refused by all, must not hide the live one's address.) It answers hellos from the start:
// another replacement dialling it meanwhile is refused at once (it has no link to take
// back), not left to wait out its deadline.
GRADWIRE_DECL void tcp_engine::join_back() {
  const int me = options.rank, n = options.size;
  if (me == 0)
    throw error(errc::config, "asio_tcp: rank 0 cannot rejoin a job (GRADWIRE_REJOIN=1): it serves the rendezvous "
                              "store; restart the whole job (from its checkpoints)");
  const join_deadline time(options.connect_timeout);
  rendezvous::store_client store(options.store_host, options.store_port, options.job_token, time.left());
  std::vector<std::pair<std::string, std::uint16_t>> addresses;
  tcp::acceptor acceptor = meet(store, time, n, addresses, false);  // every peer's latest address
  keep_listening(std::move(acceptor));
  joining = true;
  join_pending = n - 1;
  for (int r = 0; r < n; ++r)
    if (r != me) dial_back(r, addresses[r], time.until);
  // Live peers answer within moments (a stopped one never does): a short wait.
  support::run_until(io, [&] { return join_pending == 0; }, std::min(time.until, clock::now() + prompt_reply_timeout));
  joining = false;
  for (int r = 0; r < n; ++r)
    if (r != me && !links[r]) mark_absent(r, "it did not answer the hello in time");
  // Its own moment for the store (the join's deadline may be spent by now): a peer has taken
  // it back, and only later replacements need the address, so a store that does not answer
  // is a warning, not a failure of this join.
  if (std::any_of(links.begin(), links.end(), [](const auto& l) { return l && l->alive; })) try {
      publish(store, join_deadline(std::chrono::seconds(5)), *listener);
    } catch (const error& e) {
      observe::log_warning(options.rank, options.size, "asio_tcp: rank ", options.rank,
                           " (a replacement) could not publish its address; a later replacement of another rank "
                           "will not reach it: ", e.what());
    }
  for (auto& l : links)
    if (l && l->alive) read_frames(*l);
  start_watch();
}

// Dials a peer as a replacement: a peer that is gone (nobody listens) or refuses is
// absent, not a failure of the join.
GRADWIRE_DECL void tcp_engine::dial_back(int peer, const std::pair<std::string, std::uint16_t>& address, deadline until) {
  const std::string who = "rank " + std::to_string(peer);
  std::shared_ptr<tcp::socket> socket;
  try {
    // A live peer listens: a short deadline tells a gone one quickly.
    socket = std::make_shared<tcp::socket>(support::connect_with_retry(
        io, address.first, address.second, who, std::min(until, clock::now() + std::chrono::seconds(2))));
    hello(*socket);
  } catch (const std::exception& e) {
    mark_absent(peer, std::string("nobody answers at its address; it has finished or is gone (") + e.what() + ")");
    --join_pending;
    return;
  }
  await_welcome(peer, std::move(socket), [this, peer](const std::exception& e) {  // a refusal leaves it unlinked
    mark_absent(peer, e.what());
    --join_pending;
  });
}

// A peer the replacement has no link to: operations with it fail with `why`.
GRADWIRE_DECL void tcp_engine::mark_absent(int peer, const std::string& why) {
  links[peer] = std::make_unique<tcp_link>(tcp::socket(io), peer);
  tcp_link& link = *links[peer];
  link.alive = false;
  link.state.tolerated = true;
  link.state.lose("rank " + std::to_string(options.rank) + " (a replacement process, GRADWIRE_REJOIN=1) is not linked to rank " +
                  std::to_string(peer) + ": " + why);
  link.status_out.state = status::done;
  lost.push_back(peer);
}

}  // namespace gradwire::transport::detail
