// Test support: a man-in-the-middle TCP proxy that forwards a connection both ways and can alter the gradwire frames going one way.
//
// A test places it between two ranks (the dialling rank connects to the proxy instead of
// the rank it dials; see tests/transport/test_tcp_defences.cpp for how the address is
// routed through it). Bytes from the dialling side are parsed as wire frames (header,
// then `length` payload bytes) and each header is shown to the test's tamper function,
// which may rewrite it in place, put forged bytes ahead of the frame, or name one payload
// byte to invert on its way through. Bytes the other way pass untouched. A held proxy
// accepts the dialling side's connection but connects it onward only on release(), so a
// test can order events without sleeping. Plain POSIX sockets and two threads per
// connection; every blocking call is bounded or unblocked by the destructor.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gradwire/support/wire.hpp>

namespace gradwire::testing {

// What the proxy does to one frame on its way from the dialling side.
struct frame_edit {
  std::vector<std::byte> insert_before;            // written ahead of the frame (a forged frame)
  std::optional<std::uint64_t> flip_payload_byte;  // this payload byte goes through inverted
};

class mitm_proxy {
 public:
  // Sees every frame header from the dialling side, in order, before it is forwarded
  // (called on the proxy's thread); may change it in place.
  using tamper_fn = std::function<frame_edit(support::wire::header_bytes& header)>;

  // Listens on 127.0.0.1 (any free port) and forwards each connection to host:port.
  mitm_proxy(const std::string& host, std::uint16_t port, tamper_fn tamper = {}, bool held = false)
      : tamper_(std::move(tamper)), held_(held) {
    target_.sin_family = AF_INET;
    target_.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &target_.sin_addr) != 1)
      throw std::runtime_error("mitm_proxy: not an IPv4 address: " + host);
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in here{};
    here.sin_family = AF_INET;
    here.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof here;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&here), sizeof here) != 0 ||
        ::listen(listener_, 8) != 0 || ::getsockname(listener_, reinterpret_cast<sockaddr*>(&here), &size) != 0)
      throw std::runtime_error(std::string("mitm_proxy: cannot listen: ") + std::strerror(errno));
    port_ = ntohs(here.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  mitm_proxy(const mitm_proxy&) = delete;
  mitm_proxy& operator=(const mitm_proxy&) = delete;

  // Stops forwarding: every socket is shut down (which ends blocked reads and writes)
  // and every thread joined.
  ~mitm_proxy() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      for (auto& c : connections_) {
        ::shutdown(c->client, SHUT_RDWR);
        ::shutdown(c->server, SHUT_RDWR);
      }
    }
    released_.notify_all();
    acceptor_.join();
    for (auto& c : connections_) {
      if (c->up.joinable()) c->up.join();
      if (c->down.joinable()) c->down.join();
      ::close(c->client);
      ::close(c->server);
    }
    ::close(listener_);
  }

  std::uint16_t port() const noexcept { return port_; }

  // A held proxy connects what it accepted (and accepts) onward from now on.
  void release() {
    {
      std::lock_guard lock(mutex_);
      held_ = false;
    }
    released_.notify_all();
  }

  // Frames whose header the tamper function changed or put bytes ahead of.
  int altered_frames() const noexcept { return altered_.load(); }
  // Payload bytes inverted on their way through.
  int flipped_bytes() const noexcept { return flipped_.load(); }

 private:
  struct connection {
    int client = -1, server = -1;  // the dialling side, the side dialled
    std::thread up, down;
  };
  // Where a frame of the dialling side's stream is being read.
  struct frame_cursor {
    support::wire::header_bytes header{};
    std::size_t header_have = 0;
    std::uint64_t payload_left = 0, payload_offset = 0;
    std::optional<std::uint64_t> flip;
  };

  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      {
        std::unique_lock lock(mutex_);
        released_.wait(lock, [&] { return !held_ || stop_; });
        if (stop_) {
          ::close(client);
          return;
        }
      }
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (server < 0 || ::connect(server, reinterpret_cast<const sockaddr*>(&target_), sizeof target_) != 0) {
        ::close(client);  // the dialling side sees the connection close
        if (server >= 0) ::close(server);
        continue;
      }
      const int on = 1;
      ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      std::lock_guard lock(mutex_);
      auto& c = *connections_.emplace_back(std::make_unique<connection>());
      c.client = client;
      c.server = server;
      if (stop_) return;  // the destructor shuts these down and closes them
      c.up = std::thread([this, &c] { pump(c.client, c.server, true); });
      c.down = std::thread([this, &c] { pump(c.server, c.client, false); });
    }
  }

  // Forwards `from` to `to` until `from` ends (then the end goes on: shutdown for writing)
  // or a write fails.
  void pump(int from, int to, bool frames) {
    std::vector<std::byte> buffer(std::size_t{256} << 10);
    frame_cursor cursor;
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      const int ready = ::poll(&p, 1, 50);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
      if (n <= 0) break;
      const std::span<std::byte> got(buffer.data(), static_cast<std::size_t>(n));
      if (!(frames ? forward_frames(to, got, cursor) : send_all(to, got))) return;
    }
    ::shutdown(to, SHUT_WR);
  }

  bool forward_frames(int to, std::span<std::byte> bytes, frame_cursor& c) {
    namespace wire = support::wire;
    while (!bytes.empty()) {
      if (c.payload_left == 0) {  // inside a header
        const std::size_t k = std::min(wire::header_size - c.header_have, bytes.size());
        std::memcpy(c.header.data() + c.header_have, bytes.data(), k);
        c.header_have += k;
        bytes = bytes.subspan(k);
        if (c.header_have < wire::header_size) return true;
        c.header_have = 0;
        const auto length = wire::detail::get<std::uint64_t>(c.header.data() + 32);  // as the sender wrote it
        const auto original = c.header;
        frame_edit edit = tamper_ ? tamper_(c.header) : frame_edit{};
        if (c.header != original || !edit.insert_before.empty()) ++altered_;
        if (!send_all(to, edit.insert_before) || !send_all(to, c.header)) return false;
        c.payload_left = length;
        c.payload_offset = 0;
        c.flip = edit.flip_payload_byte;
        continue;
      }
      const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(c.payload_left, bytes.size()));
      if (c.flip && *c.flip >= c.payload_offset && *c.flip < c.payload_offset + k) {
        bytes[static_cast<std::size_t>(*c.flip - c.payload_offset)] ^= std::byte{0xff};
        c.flip.reset();
        ++flipped_;
      }
      if (!send_all(to, bytes.first(k))) return false;
      c.payload_left -= k;
      c.payload_offset += k;
      bytes = bytes.subspan(k);
    }
    return true;
  }

  static bool send_all(int to, std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(to, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
    return true;
  }

  tamper_fn tamper_;
  sockaddr_in target_{};
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable released_;
  bool held_;
  std::vector<std::unique_ptr<connection>> connections_;  // guarded by mutex_ until the acceptor is joined
  std::atomic<int> altered_{0}, flipped_{0};
  std::thread acceptor_;  // started at the end of the constructor
};

}  // namespace gradwire::testing
