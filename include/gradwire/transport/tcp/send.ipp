// asio_tcp's send path: a frame header and the caller's buffer in one gathered write, at once when the link is idle, else one message at a time per link.
#pragma once

#include <array>
#include <boost/asio/write.hpp>
#include <span>
#include <sys/socket.h>
#include <sys/uio.h>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::post_send(tcp_op& op) {
  if (op.peer == options.rank) return send_to_self(op);
  tcp_link& link = *links[op.peer];
  if (link.state.finished) return op.finish(errc::peer_lost, finished_message(options.rank, op.peer));
  if (link.state.lost()) return op.finish(errc::peer_lost, link.state.lost_reason);
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
  if (!link.writing && link.sends.empty() && write_now(link, op)) return;
  link.sends.push_back(&op);
  if (!link.writing) write_next(link);
}

// On an idle link the message goes out now, from the posting thread, in one non-blocking
// gathered write: a send posted right after another (a collective's check frame, then
// its data) then leaves at once too, instead of when the next wait runs the first one's
// completion handler (2 ranks, 256 B one-shot all-reduce, frame + data: two message
// latencies in a row before). True when the kernel took it all (the op is done); what it
// did not take (op.sent bytes went) is written by the io_context like any queued send.
// An error is left to that path too, which reports it as the connection's.
GRADWIRE_DECL bool tcp_engine::write_now(tcp_link& link, tcp_op& op) {
  iovec parts[2] = {{op.header.data(), op.header.size()}, {op.data, op.bytes}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = op.bytes ? 2 : 1;
  const ssize_t n = ::sendmsg(link.socket.native_handle(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n <= 0) return false;
  op.sent = static_cast<std::size_t>(n);
  if (op.sent < op.header.size() + op.bytes) return false;
  op.finish();
  return true;
}

GRADWIRE_DECL void tcp_engine::write_next(tcp_link& link) {
  if (link.sends.empty() || !link.alive) return;
  tcp_op& op = *link.sends.front();
  op.state = status::active;
  link.writing = true;
  // From where write_now stopped, if it began this message.
  const std::size_t header_left = op.sent < op.header.size() ? op.header.size() - op.sent : 0;
  const std::size_t data_from = op.sent - (op.header.size() - header_left);
  const std::array<boost::asio::const_buffer, 2> buffers{
      boost::asio::buffer(op.header.data() + (op.header.size() - header_left), header_left),
      boost::asio::buffer(op.data + data_from, op.bytes - data_from)};
  boost::asio::async_write(link.socket, buffers, whole_message, [this, &link](const boost::system::error_code& ec, std::size_t) {
    link.writing = false;
    if (ec) return broken(link, ec);
    if (!link.sends.empty()) {
      link.sends.front()->finish();
      link.sends.pop_front();
    }
    write_next(link);
  });
}

GRADWIRE_DECL void tcp_engine::send_to_self(tcp_op& op) {
  std::span<const std::byte> payload(op.data, op.bytes);
  for (auto it = self_receives.begin(); it != self_receives.end(); ++it)
    if ((*it)->tag == op.tag) {
      tcp_op& r = **it;
      self_receives.erase(it);
      deliver(r, payload);
      op.finish(r.failure, r.message);
      return;
    }
  self_arrived.push_back({op.tag, std::vector<std::byte>(payload.begin(), payload.end())});
  op.finish();
}

}  // namespace gradwire::transport::detail
