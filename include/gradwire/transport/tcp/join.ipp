// asio_tcp joining a job: the store, listening, dialling lower ranks and greeting higher ones, the hello handshake.
#pragma once

#include <algorithm>
#include <array>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../rendezvous/host_identity.hpp"
#include "../../rendezvous/store.hpp"
#include "../../support/asio.hpp"
#include "../detail/join.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::join() {
  const int me = options.rank, n = options.size;
  if (n == 1) return;
  if (options.rejoin) return join_back();
  const join_deadline time(options.connect_timeout);
  const deadline until = time.until;
  const std::string me_text = "rank " + std::to_string(me);
  start_rendezvous(name, options, true, store_server);
  rendezvous::store_client store(options.store_host, options.store_port, options.job_token, time.left());
  // Learn every lower rank's address: they are the ones this rank dials.
  std::vector<std::pair<std::string, std::uint16_t>> addresses;
  tcp::acceptor acceptor = meet(store, time, me, addresses, true);

  // Dial down, accept up, all at once, so no rank waits for another to finish.
  joining = true;
  join_pending = n - 1;
  for (int r = 0; r < me; ++r) dial(r, addresses[r], until);
  accept_peers(acceptor);
  const bool finished = support::run_until(io, [&] { return join_pending == 0 || join_failure.has_value(); }, until);
  joining = false;
  if (join_failure) throw *join_failure;
  if (!finished) {
    std::string missing;
    for (int r = 0; r < n; ++r)
      if (r != me && !links[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw error(errc::timeout, me_text + ": ranks " + missing + " did not connect within " +
                                   std::to_string(options.connect_timeout.count()) +
                                   " ms: did they start, with the same WORLD_SIZE and job token?");
  }
  keep_listening(std::move(acceptor));
  for (auto& l : links)
    if (l) read_frames(*l);
  start_watch();
}

// What every join does at the store: listen (an empty listen_host: where this rank reaches
// the store from, the interface its peers most likely reach it through; no wildcard bind),
// publish this rank's address first when `publish_first` (the job's join: the others wait
// for it; a replacement publishes once it is linked, publish()), learn the addresses of
// ranks [0, learn) but this one, and which ranks share this rank's host (one more store
// key per rank).
GRADWIRE_DECL tcp::acceptor tcp_engine::meet(rendezvous::store_client& store, const join_deadline& time, int learn,
                                             std::vector<std::pair<std::string, std::uint16_t>>& addresses,
                                             bool publish_first) {
  const int me = options.rank, n = options.size;
  const std::string host = options.listen_host.empty() ? store.local_address() : options.listen_host;
  const bool wildcard = host == "0.0.0.0" || host == "::";
  reachable_host = wildcard ? store.local_address() : host;
  const std::string what = "rank " + std::to_string(me) + "'s listening port";
  std::optional<tcp::acceptor> acceptor;
  try {
    acceptor.emplace(support::listen(io, host, options.listen_port, what));
  } catch (const error&) {
    // A replacement's fixed port may still be held by the process it replaces (stopped, not
    // yet gone): any port serves, since it publishes the one it got.
    if (!options.rejoin || options.listen_port == 0) throw;
    acceptor.emplace(support::listen(io, host, 0, what));
  }
  if (publish_first) publish(store, time, *acceptor);
  addresses.assign(static_cast<std::size_t>(learn), {});
  for (int r = 0; r < learn; ++r) {
    if (r == me) continue;
    store.set_timeout(time.left());
    addresses[r] = support::split_address(store.get_string("gradwire/tcp/" + std::to_string(r)),
                                         "the address rank " + std::to_string(r) + " published");
  }
  topology = rendezvous::exchange_topology(store, "gradwire/tcp/host/", me, n,
                                           rendezvous::local_host_identity(options.host_id), reachable_host, time.left());
  return std::move(*acceptor);
}

GRADWIRE_DECL void tcp_engine::publish(rendezvous::store_client& store, const join_deadline& time,
                                       const tcp::acceptor& acceptor) {
  store.set_timeout(time.left());
  store.set("gradwire/tcp/" + std::to_string(options.rank),
            support::address_text(reachable_host, acceptor.local_endpoint().port()));
}

GRADWIRE_DECL void tcp_engine::dial(int peer, const std::pair<std::string, std::uint16_t>& address, deadline until) {
  auto socket = std::make_shared<tcp::socket>(support::connect_with_retry(
      io, address.first, address.second, "rank " + std::to_string(peer), until));
  hello(*socket);
  await_welcome(peer, std::move(socket), [this, peer](const std::exception& e) {  // a refusal fails the join
    if (join_failure) return;
    if (const auto* known = dynamic_cast<const error*>(&e))
      join_failure = *known;
    else
      join_failure = error(errc::config, "connecting to rank " + std::to_string(peer) + ": " + e.what());
  });
}

// Reads `peer`'s answer to this rank's hello (while joining): a welcome links it and
// counts it joined; anything else (a refusal, a closed connection, a bad frame) goes to
// `refused`.
template <class Refused>
void tcp_engine::await_welcome(int peer, std::shared_ptr<tcp::socket> socket, Refused refused) {
  auto reply = std::make_shared<wire::header_bytes>();
  boost::asio::async_read(*socket, boost::asio::buffer(*reply), [this, peer, socket, reply, refused](
                                                                     const boost::system::error_code& ec, std::size_t) {
    if (!joining) return;
    try {
      check_welcome(peer, *socket, *reply, ec);
      add_link(peer, std::move(*socket));
      --join_pending;
    } catch (const std::exception& e) {
      refused(e);
    }
  });
}

// Returns when `peer` answered this rank's hello with a welcome; throws its refusal
// (auth for a wrong token, else config) or whatever else went wrong.
GRADWIRE_DECL void tcp_engine::check_welcome(int peer, tcp::socket& socket, const wire::header_bytes& reply,
                                      const boost::system::error_code& ec) {
  const std::string who = "rank " + std::to_string(peer);
  if (ec) throw error(errc::peer_lost, who + " closed the connection during the handshake: " + ec.message());
  const auto h = wire::decode(reply, token, who);
  if (h.kind == wire::frame_kind::refuse) {
    std::vector<std::byte> why(std::min<std::size_t>(h.length, 4096));
    boost::system::error_code ignored;
    boost::asio::read(socket, boost::asio::buffer(why), ignored);
    const std::string text(reinterpret_cast<const char*>(why.data()), why.size());
    throw error(text.find("token") != std::string::npos ? errc::auth : errc::config,
                who + " refused this rank's connection: " + text);
  }
  if (h.kind != wire::frame_kind::welcome || h.source != static_cast<std::uint32_t>(peer))
    throw error(errc::protocol, who + " answered the handshake with an unexpected frame");
}

GRADWIRE_DECL void tcp_engine::hello(tcp::socket& socket) {
  wire::frame_header h;
  h.kind = wire::frame_kind::hello;
  h.token_hash = token;
  h.source = static_cast<std::uint32_t>(options.rank);
  h.tag = static_cast<std::uint64_t>(options.size);  // the world size this rank was started with
  const auto bytes = wire::encode(h);
  boost::asio::write(socket, boost::asio::buffer(bytes));  // 48 bytes into a fresh socket's buffer
}

GRADWIRE_DECL void tcp_engine::accept_peers(tcp::acceptor& acceptor) {
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
GRADWIRE_DECL void tcp_engine::greet(tcp::socket socket, const wire::header_bytes& bytes) {
  std::string refusal;
  int peer = -1;
  try {
    const auto h = wire::decode(bytes, token, "a connecting process");
    peer = static_cast<int>(h.source);
    if (h.kind != wire::frame_kind::hello) throw error(errc::protocol, "expected a hello frame");
    if (h.tag != static_cast<std::uint64_t>(options.size))
      throw error(errc::config, world_size_mismatch_message(h.source, h.tag, options.rank, options.size));
    if (peer <= options.rank || peer >= options.size || links[peer])
      throw error(errc::config, "rank " + std::to_string(peer) + " cannot dial rank " +
                                    std::to_string(options.rank) + " (out of range or already connected)");
  } catch (const error& e) {
    refusal = e.kind() == errc::auth ? "wrong job token: give every rank the same GRADWIRE_JOB_TOKEN" : e.details();
  }
  if (!answer_hello(socket, refusal)) return;  // the socket closes; keep waiting for the real peer
  add_link(peer, std::move(socket));
  --join_pending;
}

// Welcomes a dialling peer (refusal empty) or refuses it with the reason; true when it
// was welcomed and the welcome was written.
GRADWIRE_DECL bool tcp_engine::answer_hello(tcp::socket& socket, const std::string& refusal) {
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
  return refusal.empty() && !ec;
}

GRADWIRE_DECL void tcp_engine::add_link(int peer, tcp::socket socket) {
  boost::system::error_code ignored;  // options that do not take leave the defaults
  socket.set_option(tcp::no_delay(true), ignored);
  if (options.socket_buffer_bytes > 0) {
    socket.set_option(boost::asio::socket_base::send_buffer_size(options.socket_buffer_bytes), ignored);
    socket.set_option(boost::asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), ignored);
  }
  watch_link(socket);
  links[peer] = std::make_unique<tcp_link>(std::move(socket), peer);
  links[peer]->address = links[peer]->socket.remote_endpoint(ignored).address().to_string();
  links[peer]->status_out.state = status::done;
  // The buffers a link reads through, allocated and touched now, not on the first step
  // (first touch is slow on these machines). The early buffer also takes the part of a
  // large frame that the frame buffer holds, so it is at least as large.
  links[peer]->stage.assign(std::max<std::size_t>(options.chunk_bytes, 1), std::byte{0});
  links[peer]->rx.assign(frame_buffer_bytes, std::byte{0});
  links[peer]->early.assign(std::max(options.early_bytes, frame_buffer_bytes), std::byte{0});
}

}  // namespace gradwire::transport::detail
