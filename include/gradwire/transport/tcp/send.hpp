// asio_tcp's send path: a frame header and the caller's buffer in one gathered write, one message at a time per link.
#pragma once

#include <array>
#include <boost/asio/write.hpp>
#include <span>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

inline void tcp_engine::post_send(tcp_op& op) {
  if (op.peer == options.rank) return send_to_self(op);
  tcp_link& link = *links[op.peer];
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

inline void tcp_engine::write_next(tcp_link& link) {
  if (link.sends.empty() || !link.alive) return;
  tcp_op& op = *link.sends.front();
  op.state = status::active;
  link.writing = true;
  const std::array<boost::asio::const_buffer, 2> buffers{boost::asio::buffer(op.header),
                                                         boost::asio::buffer(op.data, op.bytes)};
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

inline void tcp_engine::send_to_self(tcp_op& op) {
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
