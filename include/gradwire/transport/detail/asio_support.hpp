// Boost.Asio helpers shared by the TCP transport and the rendezvous store: deadlines, listening, framed I/O.
//
// Everything here drives a single-threaded io_context from the calling thread with
// run_one_until, so a blocking helper is a thin wrapper over Asio's asynchronous
// operations and always ends at its deadline.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../timeouts.hpp"
#include "../wire.hpp"

namespace gradwire::transport::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Runs handlers until done() or the deadline; false if the deadline came first.
template <class Done>
bool run_until(asio::io_context& io, Done&& done, deadline until) {
  while (!done()) {
    if (io.stopped()) io.restart();
    if (io.run_one_until(until) == 0 && clock::now() >= until) return done();
  }
  return true;
}

// "host:port" for messages.
inline std::string address_text(const std::string& host, std::uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Splits "host:port" (or "[v6]:port"); errc::config naming `what` if it does not parse.
inline std::pair<std::string, std::uint16_t> split_address(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw error(errc::config, what + ": '" + text + "' is not host:port");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  try {
    std::size_t used = 0;
    port = std::stoul(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    throw error(errc::config, what + ": '" + text + "' has no valid port");
  }
  if (port == 0 || port > 65535) throw error(errc::config, what + ": port " + std::to_string(port) + " is outside 1..65535");
  return {host, static_cast<std::uint16_t>(port)};
}

inline std::vector<tcp::endpoint> resolve(asio::io_context& io, const std::string& host, std::uint16_t port) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return {tcp::endpoint(address, port)};
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty())
    throw error(errc::config, "cannot resolve host '" + host + "': " + ec.message());
  std::vector<tcp::endpoint> out;
  for (const auto& r : results) out.push_back(r.endpoint());
  return out;
}

// A listening socket on host:port (port 0: any free port). A port in use is a config
// error that names it and says what to do; `what` names the setting (e.g. MASTER_PORT).
inline tcp::acceptor listen(asio::io_context& io, const std::string& host, std::uint16_t port, const std::string& what) {
  const tcp::endpoint endpoint = resolve(io, host, port).front();
  tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  // SO_REUSEADDR only lets a restarted job reuse a port in TIME_WAIT; two listeners
  // on one port still fail on Linux.
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use)
    throw error(errc::config, "cannot listen on " + address_text(host, port) + " (" + what +
                                  "): the port is in use, by another job or a process of an earlier one; choose "
                                  "another port, or 0 where any free port will do");
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw error(errc::config, "cannot listen on " + address_text(host, port) + " (" + what + "): " + ec.message());
  return acceptor;
}

// Connects to host:port, retrying while nobody listens yet (the peer may still be
// starting), until the deadline.
inline tcp::socket connect_with_retry(asio::io_context& io, const std::string& host, std::uint16_t port,
                                      const std::string& what, deadline until) {
  const auto endpoints = resolve(io, host, port);
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    tcp::socket socket(io);
    boost::system::error_code result = asio::error::would_block;
    asio::async_connect(socket, endpoints,
                        [&](const boost::system::error_code& ec, const tcp::endpoint&) { result = ec; });
    if (!run_until(io, [&] { return result != asio::error::would_block; }, until)) {
      socket.close();
      run_until(io, [&] { return result != asio::error::would_block; }, clock::now() + std::chrono::seconds(1));
      throw error(errc::timeout, "could not connect to " + what + " at " + address_text(host, port) +
                                     " before the deadline: is it running, and is the address right?");
    }
    if (!result) {
      socket.set_option(tcp::no_delay(true));
      return socket;
    }
    if (result != asio::error::connection_refused && result != asio::error::connection_reset &&
        result != asio::error::timed_out && result != asio::error::host_unreachable)
      throw error(errc::config, "cannot connect to " + what + " at " + address_text(host, port) + ": " + result.message());
    if (clock::now() + pause >= until)
      throw error(errc::timeout, "nobody listened at " + address_text(host, port) + " (" + what +
                                     ") before the deadline: is it running, and is the address right?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

// Writes one frame (header + payload) before the deadline.
inline void write_frame(asio::io_context& io, tcp::socket& socket, const wire::frame_header& h,
                        std::span<const std::byte> payload, deadline until, const std::string& who) {
  const wire::header_bytes header = wire::encode(h);
  std::optional<boost::system::error_code> result;
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(header), asio::buffer(payload.data(), payload.size())};
  asio::async_write(socket, buffers, [&](const boost::system::error_code& ec, std::size_t) { result = ec; });
  if (!run_until(io, [&] { return result.has_value(); }, until)) {
    socket.close();
    run_until(io, [&] { return result.has_value(); }, clock::now() + std::chrono::seconds(1));
    throw error(errc::timeout, "sending to " + who + " did not finish before the deadline");
  }
  if (*result) throw error(errc::peer_lost, "lost the connection to " + who + " while sending: " + result->message());
}

// Reads one frame before the deadline; payloads longer than max_payload are a protocol error.
inline std::pair<wire::frame_header, std::vector<std::byte>> read_frame(asio::io_context& io, tcp::socket& socket,
                                                                        std::uint64_t token_hash, deadline until,
                                                                        const std::string& who,
                                                                        std::size_t max_payload = 1 << 20) {
  auto read_exactly = [&](std::span<std::byte> into, const char* what) {
    std::optional<boost::system::error_code> result;
    asio::async_read(socket, asio::buffer(into.data(), into.size()),
                     [&](const boost::system::error_code& ec, std::size_t) { result = ec; });
    if (!run_until(io, [&] { return result.has_value(); }, until)) {
      socket.close();
      run_until(io, [&] { return result.has_value(); }, clock::now() + std::chrono::seconds(1));
      throw error(errc::timeout, std::string("no ") + what + " from " + who + " before the deadline");
    }
    if (*result == asio::error::eof)
      throw error(errc::peer_lost, who + " closed the connection (" + what + " expected)");
    if (*result) throw error(errc::peer_lost, "lost the connection to " + who + ": " + result->message());
  };
  wire::header_bytes header;
  read_exactly(header, "frame header");
  wire::frame_header h = wire::decode(header, token_hash, who);
  if (h.length > max_payload)
    throw error(errc::protocol, who + " sent a " + std::to_string(h.length) + "-byte control frame; the limit is " +
                                    std::to_string(max_payload));
  std::vector<std::byte> payload(static_cast<std::size_t>(h.length));
  if (!payload.empty()) read_exactly(payload, "frame payload");
  wire::check_payload(h, payload, who);
  return {h, std::move(payload)};
}

}  // namespace gradwire::transport::detail
