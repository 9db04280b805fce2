// The parameter server's wire protocol: tags, request and reply headers, and the layout of a server's window.
//
// A worker talks to each server over three tags: requests (push, pull, done), the pushed
// gradient (a tagged push), and the server's reply ([reply_header][shard parameters]).
// Over one-sided access the gradient and the parameters travel by put and get through the
// server's window instead, and only the headers go as messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "../error.hpp"

namespace gradwire::ps::detail {

// Far above collective tags (sequence << 16 reaches it after 4e9 operations), and within
// the 48 bits every transport carries.
inline constexpr std::uint64_t tag_base = std::uint64_t{0xF5} << 40;
inline constexpr std::uint64_t request_tag = tag_base | 1, gradient_tag = tag_base | 2, reply_tag = tag_base | 3;
inline constexpr std::uint64_t window_size_tag = tag_base | 4, window_key_tag = tag_base | 5;
// Server -> its standby (replica.hpp): each update's header, then its gradient; standby ->
// server: the acknowledgement of each update it applied.
inline constexpr std::uint64_t replica_tag = tag_base | 6, replica_gradient_tag = tag_base | 7,
                               replica_ack_tag = tag_base | 8, replica_hello_tag = tag_base | 9;
// Setup with a push codec: every rank -> the chief, what its pushes' layout is (push_codec.hpp).
inline constexpr std::uint64_t codec_check_tag = tag_base | 10;

// request_header::flags. push: the gradient is already in the worker's landing zone of
// the server's window; pull: answer with the reply header only, the worker gets the
// parameters from the window.
inline constexpr std::uint32_t in_window = 1;

enum class request_kind : std::uint32_t { push = 1, pull = 2, done = 3 };

// Worker -> server, before a push's gradient or as a pull.
struct request_header {
  request_kind kind{};
  std::uint32_t flags = 0;    // in_window
  std::uint64_t version = 0;  // push: the version its parameters came from; pull: the least version wanted
  std::uint64_t clock = 0;    // the worker's pushes so far (this one included)
  std::uint64_t updates = 0;  // push: the server's update count when the worker pulled
};
// Server -> worker, before the shard's parameters.
struct reply_header {
  std::uint64_t version = 0;
  std::uint64_t updates = 0;
  std::uint64_t applied = 0;
  std::uint64_t staleness = 0;  // of this worker's latest gradient the server took (0: sync modes)
  std::uint32_t lost = 0;       // workers lost so far
  std::int32_t last_lost = -1;  // the latest of them
};
static_assert(sizeof(request_header) == 32 && sizeof(reply_header) == 40);

// A request as server rank `server` received it from worker rank `worker`, checked
// before the server acts on it: its size, a known kind, no unknown flags, and fields that
// a worker of this server can send. A worker's version and update count come from this
// server's replies, which only grow: a push cannot be from a later version than
// `server_version` or have seen more than `server_updates`, and a pull waits for at most
// the next version. errc::protocol naming the worker otherwise.
inline request_header decode_request(std::span<const std::byte> bytes, int server, int worker,
                                     std::uint64_t server_version, std::uint64_t server_updates) {
  auto bad = [&](const std::string& what) {
    return error(errc::protocol, "parameter server rank " + std::to_string(server) + ": worker rank " +
                                     std::to_string(worker) + " sent " + what +
                                     "; do all ranks run the same gradwire build?");
  };
  if (bytes.size() != sizeof(request_header))
    throw bad("a " + std::to_string(bytes.size()) + "-byte request (expected " + std::to_string(sizeof(request_header)) + ")");
  request_header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  const auto kind = static_cast<std::uint32_t>(h.kind);
  if (h.kind != request_kind::push && h.kind != request_kind::pull && h.kind != request_kind::done)
    throw bad("an unknown request kind " + std::to_string(kind));
  if ((h.flags & ~in_window) != 0 || (h.kind == request_kind::done && h.flags != 0))
    throw bad("request kind " + std::to_string(kind) + " with unknown flags " + std::to_string(h.flags));
  if (h.kind == request_kind::push && (h.clock == 0 || h.version > server_version || h.updates > server_updates))
    throw bad("a push of clock " + std::to_string(h.clock) + " from version " + std::to_string(h.version) +
              " after " + std::to_string(h.updates) + " updates; this server is at version " +
              std::to_string(server_version) + " after " + std::to_string(server_updates) + " updates");
  if (h.kind == request_kind::pull && ((h.version > 0 && h.version - 1 > server_version) || h.updates != 0))
    throw bad("a pull for version " + std::to_string(h.version) + " (updates " + std::to_string(h.updates) +
              "); this server is at version " + std::to_string(server_version));
  if (h.kind == request_kind::done && (h.version != 0 || h.updates != 0))
    throw bad("a done request with version " + std::to_string(h.version) + " and updates " + std::to_string(h.updates));
  return h;
}

// A reply's header as worker rank `worker` received it from server rank `server`, checked
// before the worker trusts it: its size, at least the version the pull asked for
// (`least_version`), a staleness that is not beyond the version, and a latest lost worker
// among the `workers` there are (the loss count is not bounded by them: a worker that
// rejoined may be lost again). errc::protocol naming the server otherwise.
inline reply_header decode_reply(std::span<const std::byte> bytes, int server, std::uint64_t least_version,
                                 int workers) {
  auto bad = [&](const std::string& what) {
    return error(errc::protocol, "parameter_server: server rank " + std::to_string(server) + " sent " + what +
                                     "; do all ranks run the same gradwire build?");
  };
  if (bytes.size() < sizeof(reply_header))
    throw bad("a " + std::to_string(bytes.size()) + "-byte reply, shorter than its " +
              std::to_string(sizeof(reply_header)) + "-byte header");
  reply_header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.version < least_version || h.staleness > h.version)
    throw bad("a reply of version " + std::to_string(h.version) + " with staleness " + std::to_string(h.staleness) +
              " to a pull for version " + std::to_string(least_version));
  if ((h.lost == 0) != (h.last_lost == -1) || h.last_lost < -1 || h.last_lost >= workers)
    throw bad("a reply that counts " + std::to_string(h.lost) + " lost worker(s), the latest rank " +
              std::to_string(h.last_lost) + ", in a job of " + std::to_string(workers) + " worker(s)");
  return h;
}

enum class replica_kind : std::uint32_t { update = 1, done = 2 };

// Server -> standby, before an update's gradient: the server's counters before the update
// (the learning-rate schedule's inputs) and after it, and the gradient's factor. `done`:
// the server finished (its workers are done); no gradient follows.
struct replica_header {
  replica_kind kind{};
  std::uint32_t reserved = 0;
  double scale = 0;
  std::uint64_t version = 0, updates = 0, applied = 0;  // before
  std::uint64_t next_version = 0, next_applied = 0;     // after (updates + 1 after)
};
// Standby -> server: it applied the update that took the server to `updates` updates and `version`.
struct replica_ack {
  std::uint64_t version = 0, updates = 0;
};
// Standby -> server, first: the version it starts from and a checksum of its shard.
struct replica_hello {
  std::uint64_t version = 0, checksum = 0;
};
static_assert(sizeof(replica_header) == 56 && sizeof(replica_ack) == 16 && sizeof(replica_hello) == 16);

// An update's header as standby rank `standby` received it from server rank `server`,
// checked before the standby applies it: the stream is in order (the next update after
// the standby's `updates`), counters that never go back, and a factor a server sends (1/n
// or 1/lag: in (0, 1], and a normal float, so that it converts to any value type). An end
// has every other field 0. errc::protocol naming both otherwise.
inline replica_header decode_replica_header(std::span<const std::byte> bytes, int standby, int server,
                                            std::uint64_t version, std::uint64_t updates, std::uint64_t applied) {
  auto bad = [&](const std::string& what) {
    return error(errc::protocol, "parameter server standby rank " + std::to_string(standby) + ": server rank " +
                                     std::to_string(server) + " sent " + what +
                                     "; do all ranks run the same gradwire build?");
  };
  if (bytes.size() != sizeof(replica_header))
    throw bad("a " + std::to_string(bytes.size()) + "-byte update header (expected " +
              std::to_string(sizeof(replica_header)) + ")");
  replica_header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.kind == replica_kind::done) {
    if (h.reserved != 0 || h.scale != 0 || h.version != 0 || h.updates != 0 || h.applied != 0 ||
        h.next_version != 0 || h.next_applied != 0)
      throw bad("an end of updates with fields set");
    return h;
  }
  if (h.kind != replica_kind::update || h.reserved != 0)
    throw bad("an unknown update kind " + std::to_string(static_cast<std::uint32_t>(h.kind)));
  if (!(h.scale >= static_cast<double>(std::numeric_limits<float>::min()) && h.scale <= 1))
    throw bad("an update with the factor " + std::to_string(h.scale));
  if (h.updates != updates || h.version < version || h.applied < applied || h.next_version < h.version ||
      h.next_applied < h.applied)
    throw bad("update " + std::to_string(h.updates + 1) + " (version " + std::to_string(h.version) + " -> " +
              std::to_string(h.next_version) + ", applied " + std::to_string(h.applied) + " -> " +
              std::to_string(h.next_applied) + ") after update " + std::to_string(updates) + " at version " +
              std::to_string(version));
  return h;
}

// A standby's acknowledgement as server rank `server` received it from standby rank
// `standby`: of the next update, acked + 1 (of `replicated` sent), and of the version that
// update took the server to (`version`): a standby acknowledges each update in turn, and a
// sync server answers pulls up to the version acknowledged. errc::protocol otherwise.
inline replica_ack decode_replica_ack(std::span<const std::byte> bytes, int server, int standby, std::uint64_t acked,
                                      std::uint64_t replicated, std::uint64_t version) {
  replica_ack a;
  if (bytes.size() == sizeof a) std::memcpy(&a, bytes.data(), sizeof a);
  if (bytes.size() != sizeof a || acked >= replicated || a.updates != acked + 1 || a.version != version)
    throw error(errc::protocol, "parameter server rank " + std::to_string(server) + ": standby rank " +
                                    std::to_string(standby) + " acknowledged update " + std::to_string(a.updates) +
                                    " at version " + std::to_string(a.version) + " in a " +
                                    std::to_string(bytes.size()) + "-byte message; expected update " +
                                    std::to_string(acked + 1) + " of " + std::to_string(replicated) +
                                    " sent, at version " + std::to_string(version) +
                                    "; do all ranks run the same gradwire build?");
  return a;
}

// A reply is one message, [reply_header][parameters]: a buffer of V that holds it keeps
// the header in its first reply_header_elements<V> elements, so the parameters stay
// aligned and typed.
template <class V>
inline constexpr std::size_t reply_header_elements = sizeof(reply_header) / sizeof(V);
static_assert(sizeof(reply_header) % sizeof(double) == 0 && sizeof(reply_header) % sizeof(float) == 0);

// A server's window: per worker, [reply header][its shard's parameters] then [gradient],
// each block 64-byte aligned. Both sides compute it from the sharding (and, for pushes
// through a codec, the payload's bytes: push_codec.hpp).
struct window_layout {
  std::size_t reply_bytes = 0, gradient_bytes = 0;

  template <class V>
  static window_layout of(std::size_t elements) noexcept {
    return {sizeof(reply_header) + elements * sizeof(V), elements * sizeof(V)};
  }
  // The gradient zone holds a push's payload of `gradient_bytes` instead of its elements in V.
  template <class V>
  static window_layout of(std::size_t elements, std::size_t gradient_bytes) noexcept {
    return {sizeof(reply_header) + elements * sizeof(V), gradient_bytes};
  }
  static constexpr std::size_t round_up(std::size_t n) noexcept { return (n + 63) / 64 * 64; }
  std::size_t stride() const noexcept { return round_up(reply_bytes) + round_up(gradient_bytes); }
  std::size_t size(int workers) const noexcept { return stride() * static_cast<std::size_t>(workers); }
  std::size_t reply(int worker) const noexcept { return static_cast<std::size_t>(worker) * stride(); }
  std::size_t gradient(int worker) const noexcept { return reply(worker) + round_up(reply_bytes); }
};

template <class T>
std::span<const std::byte> bytes_of(const T& v) {
  return std::as_bytes(std::span(&v, 1));
}
template <class T>
std::span<std::byte> writable_bytes_of(T& v) {
  return std::as_writable_bytes(std::span(&v, 1));
}

}  // namespace gradwire::ps::detail
