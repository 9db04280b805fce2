// Framed I/O of the rendezvous store: one wire frame written or read before a deadline.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../support/asio.hpp"
#include "../support/wire.hpp"
#include "../timeouts.hpp"

namespace gradwire::rendezvous::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace wire = support::wire;
using support::run_until;

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

// The checks of a received control frame's header, before its payload is read: a frame
// of this job (wire::decode) with at most `max_payload` payload bytes; errc::protocol
// (auth for another job's) naming `who`.
inline wire::frame_header decode_control_header(std::span<const std::byte> header, std::uint64_t token_hash,
                                                const std::string& who, std::size_t max_payload) {
  wire::frame_header h = wire::decode(header, token_hash, who);
  if (h.length > max_payload)
    throw error(errc::protocol, who + " sent a " + std::to_string(h.length) + "-byte control frame; the limit is " +
                                    std::to_string(max_payload));
  return h;
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
  const wire::frame_header h = decode_control_header(header, token_hash, who, max_payload);
  std::vector<std::byte> payload(static_cast<std::size_t>(h.length));
  if (!payload.empty()) read_exactly(payload, "frame payload");
  wire::check_payload(h, payload, who);
  return {h, std::move(payload)};
}

}  // namespace gradwire::rendezvous::detail
