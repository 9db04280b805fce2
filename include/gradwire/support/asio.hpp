// Boost.Asio helpers shared by the TCP transport and the rendezvous store: deadlines, addresses, listening, connecting.
//
// Everything here drives a single-threaded io_context from the calling thread with
// run_one_until, so a blocking helper is a thin wrapper over Asio's asynchronous
// operations and always ends at its deadline.
#pragma once

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../clock.hpp"
#include "../error.hpp"

namespace gradwire::support {

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

}  // namespace gradwire::support
