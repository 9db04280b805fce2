// asio_tcp's receive path: frames read through a per-link buffer, large payloads read into place, buffered (eager) or read ahead, chunked accumulation, matching by tag.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <boost/asio/read.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void tcp_engine::post_recv(tcp_op& op) {
  if (op.peer == options.rank) return receive_from_self(op);
  tcp_link& link = *links[op.peer];
  // An earlier arrival with this tag is the message (tags match in arrival order).
  for (auto it = link.arrived.begin(); it != link.arrived.end(); ++it)
    if (it->tag == op.tag) {
      deliver(op, it->payload);
      give_back(std::move(it->payload));
      link.arrived.erase(it);
      return;
    }
  if (link.parked && link.incoming.tag == op.tag) {
    link.parked = false;
    if (!link.early_reading) return resume_parked(link, op);
    op.state = status::active;  // the read-ahead is in flight: it resumes the message when it lands
    link.reading = &op;
    return;
  }
  if (link.state.finished) return op.finish(errc::peer_lost, finished_message(options.rank, op.peer));
  // A lost peer that may come back (allow_rejoin): the receive waits for its replacement.
  if (link.state.lost() && !link.rejoinable) return op.finish(errc::peer_lost, link.state.lost_reason);
  link.receives.push_back(&op);
}

// Reads what the kernel holds for this link, up to the frame buffer's free space, in one
// system call, and handles every frame in it: a small message costs one read and one
// handler, not one each for its header and its payload (docs/perf/tcp.md).
GRADWIRE_DECL void tcp_engine::read_frames(tcp_link& link) {
  if (link.rx_begin == link.rx_end) link.rx_begin = link.rx_end = 0;
  link.socket.async_read_some(
      boost::asio::buffer(link.rx.data() + link.rx_end, link.rx.size() - link.rx_end),
      [this, &link](const boost::system::error_code& ec, std::size_t n) {
        if (ec) return broken(link, ec);
        link.rx_end += n;
        on_frames(link);
      });
}

// Handles the buffered frames in order. A whole frame is taken from the buffer; an
// incomplete small one waits there for its rest; of an incomplete larger one, the
// buffered bytes become the head of its payload (link.early) and the rest is read from
// the socket as before (into place, into memory, or parked: on_large_frame).
GRADWIRE_DECL void tcp_engine::on_frames(tcp_link& link) {
  for (;;) {
    const std::size_t have = link.rx_end - link.rx_begin;
    const std::byte* at = link.rx.data() + link.rx_begin;
    if (have < wire::header_size) break;
    if (!accept_header(link, {at, wire::header_size})) return;
    if (link.incoming.kind == wire::frame_kind::goodbye) return on_goodbye(link);  // nothing follows it
    const auto length = link.incoming.length;
    const std::size_t payload = have - wire::header_size;
    if (length <= payload) {
      link.rx_begin += wire::header_size + static_cast<std::size_t>(length);
      if (!on_buffered_frame(link, {at + wire::header_size, static_cast<std::size_t>(length)})) return;
      continue;
    }
    if (length <= buffered_payload_bytes) break;  // its rest fits: read more into the buffer
    std::memcpy(link.early.data(), at + wire::header_size, payload);
    link.early_filled = payload;
    link.rx_begin = link.rx_end = 0;
    return on_large_frame(link);
  }
  // Keep the partial frame at the front, so that the next read can complete it.
  const std::size_t have = link.rx_end - link.rx_begin;
  if (link.rx_begin) std::memmove(link.rx.data(), link.rx.data() + link.rx_begin, have);
  link.rx_begin = 0;
  link.rx_end = have;
  read_frames(link);
}

// Decodes and checks a frame's header into link.incoming; loses the link if it is bad.
GRADWIRE_DECL bool tcp_engine::accept_header(tcp_link& link, std::span<const std::byte> bytes) {
  const std::string who = "rank " + std::to_string(link.peer);
  try {
    link.incoming = wire::decode(bytes, token, who);
  } catch (const error& e) {
    lose(link, e.kind(), e.details());
    return false;
  }
  const auto& h = link.incoming;
  if (h.source != static_cast<std::uint32_t>(link.peer)) {
    lose(link, errc::protocol, who + " sent a frame claiming to come from rank " + std::to_string(h.source));
    return false;
  }
  const bool known = h.kind == wire::frame_kind::data || h.kind == wire::frame_kind::abort ||
                     h.kind == wire::frame_kind::status || h.kind == wire::frame_kind::goodbye;
  if (!known) {
    lose(link, errc::protocol, who + " sent an unexpected frame kind " + std::to_string(int(h.kind)));
    return false;
  }
  if ((h.kind == wire::frame_kind::abort && h.length > max_abort_bytes) ||
      (h.kind == wire::frame_kind::status && h.length > max_status_bytes)) {
    lose(link, errc::protocol, who + " sent an oversized " + (h.kind == wire::frame_kind::abort ? "abort" : "status") +
                                   " frame");
    return false;
  }
  return true;
}

// A whole frame (link.incoming) whose payload is in the frame buffer. Returns whether
// the link reads on.
GRADWIRE_DECL bool tcp_engine::on_buffered_frame(tcp_link& link, std::span<const std::byte> payload) {
  const auto kind = link.incoming.kind;
  try {
    wire::check_payload(link.incoming, payload, "rank " + std::to_string(link.peer));
  } catch (const error& e) {
    lose(link, e.kind(), e.details());
    return false;
  }
  if (kind == wire::frame_kind::abort) {
    on_abort(link, std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    return false;
  }
  if (kind == wire::frame_kind::status) return on_status(link, payload);
  if (tcp_op* op = take_receive(link, link.incoming.tag)) {
    deliver(*op, payload);
    return link.alive;
  }
  arrived_message m;
  m.tag = link.incoming.tag;
  m.payload = take_buffer(payload.size());
  if (!payload.empty()) std::memcpy(m.payload.data(), payload.data(), payload.size());
  link.arrived.push_back(std::move(m));
  return true;
}

// A frame longer than the buffer holds; its first link.early_filled payload bytes are in
// link.early.
GRADWIRE_DECL void tcp_engine::on_large_frame(tcp_link& link) {
  const auto& h = link.incoming;
  if (h.kind != wire::frame_kind::data) return read_eager(link);  // an abort or status frame's text
  if (tcp_op* op = take_receive(link, h.tag)) return resume_parked(link, *op);
  // Up to eager_bytes, or larger while a receive for a later message already waits on this
  // link (its bytes are behind this one): into memory. Otherwise its head is read ahead into
  // the link's early buffer and the rest stays in the kernel until its receive is posted
  // (post_recv) or another one is waited for (wait.hpp): bounded memory per link, and
  // the sender is not held up by a receiver that is a little behind.
  if (h.length <= options.eager_bytes || !link.receives.empty()) return read_eager(link);
  link.parked = true;
  read_ahead(link);
}

// Reads the rest of the parked message's head (up to early_bytes) into link.early. When it
// lands, a receive posted meanwhile takes the message, or a wait that needs the stream
// beyond it (evict) takes it into memory; otherwise it stays parked with its head here.
GRADWIRE_DECL void tcp_engine::read_ahead(tcp_link& link) {
  const std::size_t have = link.early_filled;  // from the frame buffer
  const std::size_t head = std::min<std::size_t>(link.early.size(), link.incoming.length);
  if (head <= have) return;
  link.early_reading = true;
  boost::asio::async_read(link.socket, boost::asio::buffer(link.early.data() + have, head - have), whole_message,
                          [this, &link, head](const boost::system::error_code& ec, std::size_t) {
                            link.early_reading = false;
                            if (ec) return broken(link, ec);
                            link.early_filled = head;
                            const bool evict = std::exchange(link.evict, false);
                            if (tcp_op* op = std::exchange(link.reading, nullptr)) return resume_parked(link, *op);
                            if (evict && link.parked) {
                              link.parked = false;
                              read_eager(link);
                            }
                          });
}

// The receive of the parked message is posted: its head goes from link.early into place
// (copied, or added), the rest is read as if the receive had been posted in time.
GRADWIRE_DECL void tcp_engine::resume_parked(tcp_link& link, tcp_op& op) {
  const std::size_t head = std::exchange(link.early_filled, 0);
  if (op.bytes != link.incoming.length) {
    fail_size(op, link.incoming.length);
    return drain(link, static_cast<std::size_t>(link.incoming.length) - head);  // keeps the stream in step
  }
  op.state = status::active;
  link.reading = &op;
  if (op.deliver != deliver_copy) {
    // Added in whole elements: a head that ends inside one (the frame buffer holds what
    // one read returned) leaves its last bytes to the stage, before the next chunk.
    const std::size_t whole = head / 16 * 16, carried = head - whole;
    if (whole) op.deliver(op.data, link.early.data(), whole);
    if (carried) std::memcpy(link.stage.data(), link.early.data() + whole, carried);
    const std::uint32_t crc =
        (link.incoming.flags & wire::payload_checksummed) ? wire::crc32c({link.early.data(), head}, 0) : 0;
    return read_accumulating(link, whole, crc, carried);
  }
  if (head) op.deliver(op.data, link.early.data(), head);
  read_in_place(link, head);
}

// Reads link.reading's payload from byte `offset` on straight into place, then checks
// the whole payload (bytes before `offset` were put there from the early buffer).
GRADWIRE_DECL void tcp_engine::read_in_place(tcp_link& link, std::size_t offset) {
  tcp_op& op = *link.reading;
  boost::asio::async_read(link.socket, boost::asio::buffer(op.data + offset, op.bytes - offset), whole_message,
                          [this, &link](const boost::system::error_code& ec, std::size_t) {
                            if (ec) return broken(link, ec);
                            tcp_op* done = std::exchange(link.reading, nullptr);
                            if (done) {
                              try {
                                wire::check_payload(link.incoming, {done->data, done->bytes},
                                                    "rank " + std::to_string(link.peer));
                              } catch (const error& e) {
                                link.reading = done;  // fails with the rest, in the rank's words
                                return lose(link, e.kind(), e.details());
                              }
                              done->finish();
                            }
                            read_frames(link);
                          });
}

// Reads link.reading's payload through the link's stage in chunks, adding each into
// place as it lands, from byte `offset` on; the stage's first `carried` bytes (fewer than
// 16) were read already. `crc` carries the payload checksum of every byte read so far.
GRADWIRE_DECL void tcp_engine::read_accumulating(tcp_link& link, std::size_t offset, std::uint32_t crc, std::size_t carried) {
  tcp_op& op = *link.reading;
  const std::size_t chunk = std::min(link.stage.size(), op.bytes - offset);
  auto on_chunk = [this, &link, offset, crc, chunk, carried](const boost::system::error_code& ec, std::size_t) {
    if (ec) return broken(link, ec);
    tcp_op* op = link.reading;
    if (!op) return;  // withdrawn mid-message: the connection is being closed
    const std::span<const std::byte> fresh(link.stage.data() + carried, chunk - carried);
    const std::uint32_t sum = (link.incoming.flags & wire::payload_checksummed) ? wire::crc32c(fresh, crc) : crc;
    if (chunk) op->deliver(op->data + offset, link.stage.data(), chunk);
    if (offset + chunk < op->bytes) return read_accumulating(link, offset + chunk, sum, 0);
    if ((link.incoming.flags & wire::payload_checksummed) && sum != link.incoming.payload_crc)  // op fails with the rest
      return lose(link, errc::protocol,
                  wire::corrupt_payload_message(link.incoming, sum, "rank " + std::to_string(link.peer)));
    link.reading = nullptr;
    op->finish();
    read_frames(link);
  };
  if (chunk == carried) return on_chunk({}, 0);
  boost::asio::async_read(link.socket, boost::asio::buffer(link.stage.data() + carried, chunk - carried),
                          whole_message, on_chunk);
}

// Reads and drops `left` payload bytes through the stage, then the next header.
GRADWIRE_DECL void tcp_engine::drain(tcp_link& link, std::size_t left) {
  if (left == 0) return read_frames(link);
  const std::size_t chunk = std::min(link.stage.size(), left);
  boost::asio::async_read(link.socket, boost::asio::buffer(link.stage.data(), chunk), whole_message,
                          [this, &link, left, chunk](const boost::system::error_code& ec, std::size_t) {
                            if (ec) return broken(link, ec);
                            drain(link, left - chunk);
                          });
}

// Reads the frame's payload into memory; a head already read ahead (link.early) comes first.
GRADWIRE_DECL void tcp_engine::read_eager(tcp_link& link) {
  link.reading_eager.emplace();
  link.reading_eager->tag = link.incoming.tag;
  link.reading_eager->payload = take_buffer(static_cast<std::size_t>(link.incoming.length));
  const std::size_t head = std::exchange(link.early_filled, 0);
  auto& payload = link.reading_eager->payload;
  if (head) std::memcpy(payload.data(), link.early.data(), head);
  boost::asio::async_read(link.socket, boost::asio::buffer(payload.data() + head, payload.size() - head), whole_message,
                          [this, &link](const boost::system::error_code& ec, std::size_t) {
                            if (ec) return broken(link, ec);
                            arrived_message m = std::move(*link.reading_eager);
                            link.reading_eager.reset();
                            const std::string who = "rank " + std::to_string(link.peer);
                            try {
                              wire::check_payload(link.incoming, m.payload, who);
                            } catch (const error& e) {
                              return lose(link, e.kind(), e.details());
                            }
                            if (link.incoming.kind == wire::frame_kind::abort)
                              return on_abort(link, std::string(reinterpret_cast<const char*>(m.payload.data()),
                                                                m.payload.size()));
                            if (link.incoming.kind == wire::frame_kind::status) {
                              const bool fine = on_status(link, m.payload);
                              give_back(std::move(m.payload));
                              if (fine) read_frames(link);
                              return;
                            }
                            on_eager(link, std::move(m));
                            read_frames(link);
                          });
}

GRADWIRE_DECL void tcp_engine::on_eager(tcp_link& link, arrived_message m) {
  // A receive posted while the payload was being read takes it now.
  if (tcp_op* op = take_receive(link, m.tag)) {
    deliver(*op, m.payload);
    return give_back(std::move(m.payload));
  }
  link.arrived.push_back(std::move(m));
}

// Eager payloads reuse a few buffers instead of allocating per message.
GRADWIRE_DECL std::vector<std::byte> tcp_engine::take_buffer(std::size_t bytes) {
  std::vector<std::byte> b;
  if (!spare_buffers.empty()) {
    b = std::move(spare_buffers.back());
    spare_buffers.pop_back();
  }
  b.resize(bytes);
  return b;
}

GRADWIRE_DECL void tcp_engine::give_back(std::vector<std::byte> b) {
  if (spare_buffers.size() < 16 && b.capacity() <= options.eager_bytes) spare_buffers.push_back(std::move(b));
}

// The first posted receive for `tag` on the link, taken off its queue (nullptr if none).
GRADWIRE_DECL tcp_op* tcp_engine::take_receive(tcp_link& link, std::uint64_t tag) {
  const auto it = std::find_if(link.receives.begin(), link.receives.end(), [tag](const tcp_op* op) { return op->tag == tag; });
  if (it == link.receives.end()) return nullptr;
  tcp_op* op = *it;
  link.receives.erase(it);
  return op;
}

GRADWIRE_DECL void tcp_engine::deliver(tcp_op& op, std::span<const std::byte> payload) {
  if (payload.size() != op.bytes) return fail_size(op, payload.size());
  // Nothing to move: an empty buffer's data may be null, which memcpy may not be given.
  if (payload.empty()) return op.finish();
  if (op.deliver != deliver_copy && reinterpret_cast<std::uintptr_t>(payload.data()) % 16 != 0) {
    // The add reads whole elements: a payload in the frame buffer behind a frame of odd
    // length is not aligned for them, so it is added from aligned memory.
    std::vector<std::byte> aligned = take_buffer(payload.size());
    std::memcpy(aligned.data(), payload.data(), payload.size());
    op.deliver(op.data, aligned.data(), aligned.size());
    give_back(std::move(aligned));
    return op.finish();
  }
  op.deliver(op.data, payload.data(), payload.size());
  op.finish();
}

GRADWIRE_DECL void tcp_engine::fail_size(tcp_op& op, std::uint64_t sent) {
  op.finish(errc::mismatch, size_mismatch_message(op.peer, sent, op.tag, options.rank, op.bytes));
}

GRADWIRE_DECL void tcp_engine::receive_from_self(tcp_op& op) {
  for (auto it = self_arrived.begin(); it != self_arrived.end(); ++it)
    if (it->tag == op.tag) {
      deliver(op, it->payload);
      self_arrived.erase(it);
      return;
    }
  self_receives.push_back(&op);
}

}  // namespace gradwire::transport::detail
