// Rendezvous store: a small TCP key-value store run by rank 0, through which ranks exchange addresses.
//
// store_server serves set / get / add on its own thread; get waits on the server until
// the key is set, so ranks that start in any order meet without polling. store_client
// makes blocking calls with deadlines. Both speak wire frames, so a client of another
// job (different GRADWIRE_JOB_TOKEN) is refused with a message saying so.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "../support/asio.hpp"
#include "../support/wire.hpp"
#include "../timeouts.hpp"
#include "framed_io.hpp"

namespace gradwire::rendezvous {

namespace detail {

enum class store_op : std::uint64_t { set = 1, get = 2, add = 3 };
inline constexpr std::size_t max_store_value = std::size_t{64} << 20;

// Request payload: u32 key length, key, value.
inline std::vector<std::byte> pack(const std::string& key, std::span<const std::byte> value) {
  std::vector<std::byte> out(4 + key.size() + value.size());
  const auto length = static_cast<std::uint32_t>(key.size());
  std::memcpy(out.data(), &length, 4);
  std::memcpy(out.data() + 4, key.data(), key.size());
  if (!value.empty()) std::memcpy(out.data() + 4 + key.size(), value.data(), value.size());
  return out;
}

inline std::int64_t as_int(std::span<const std::byte> v) {
  std::int64_t x = 0;
  if (v.size() == 8) std::memcpy(&x, v.data(), 8);
  return x;
}

// A request as the server reads it; `value` views the payload it was parsed from.
struct store_request {
  store_op op{};
  std::string key;
  std::span<const std::byte> value;
};

// The server's checks of a request's header, before it reads the payload: a frame of
// this job (decode), a store request, and a payload within the store's limit.
inline wire::frame_header decode_store_request_header(std::span<const std::byte> header, std::uint64_t token_hash,
                                                      std::string_view who) {
  const wire::frame_header h = wire::decode(header, token_hash, who);
  if (h.kind != wire::frame_kind::store_request)
    throw error(errc::protocol, "not a store request from " + std::string(who) + " (frame kind " +
                                    std::to_string(static_cast<int>(h.kind)) + ")");
  if (h.length > max_store_value + 4096)
    throw error(errc::protocol, "store request from " + std::string(who) + " announces " + std::to_string(h.length) +
                                    " bytes, more than the limit of " + std::to_string(max_store_value + 4096));
  return h;
}

// Parses a request's payload (see pack): u32 key length, key, value; the request kind is
// the header's tag. errc::protocol naming `who` for anything else.
inline store_request parse_store_request(const wire::frame_header& h, std::span<const std::byte> payload,
                                         std::string_view who) {
  wire::check_payload(h, payload, who);
  std::uint32_t key_length = 0;
  if (payload.size() < 4 || (std::memcpy(&key_length, payload.data(), 4), key_length > payload.size() - 4))
    throw error(errc::protocol, "malformed store request from " + std::string(who) + ": its key length does not fit "
                                    "its " + std::to_string(payload.size()) + "-byte payload");
  store_request r;
  r.key.assign(reinterpret_cast<const char*>(payload.data()) + 4, key_length);
  r.value = payload.subspan(4 + key_length);
  switch (static_cast<store_op>(h.tag)) {
    case store_op::set:
    case store_op::get: r.op = static_cast<store_op>(h.tag); return r;
    case store_op::add:
      if (r.value.size() != 8)
        throw error(errc::protocol, "store add from " + std::string(who) + " for '" + r.key + "' carries " +
                                        std::to_string(r.value.size()) + " bytes instead of an 8-byte integer");
      r.op = store_op::add;
      return r;
  }
  throw error(errc::protocol, "unknown store request " + std::to_string(h.tag) + " from " + std::string(who));
}

// The value of the server's answer to a request of kind `op` (frame header `h`, payload
// `body`); a refusal becomes the server's reason as an error (auth when it names the job
// token), anything else errc::protocol naming `where`.
inline std::vector<std::byte> parse_store_reply(const wire::frame_header& h, std::vector<std::byte> body,
                                                store_op op, const std::string& where) {
  if (h.kind == wire::frame_kind::refuse) {
    const std::string why(reinterpret_cast<const char*>(body.data()), body.size());
    const bool auth = why.find("job token") != std::string::npos;
    throw error(auth ? errc::auth : errc::protocol, where + " refused the request: " + why);
  }
  if (h.kind != wire::frame_kind::store_reply)
    throw error(errc::protocol, where + " answered with an unexpected frame (kind " +
                                    std::to_string(static_cast<int>(h.kind)) + ")");
  if ((op == store_op::add && body.size() != 8) || (op == store_op::set && !body.empty()))
    throw error(errc::protocol, where + " answered a store " + (op == store_op::add ? "add" : "set") + " with " +
                                    std::to_string(body.size()) + " bytes (expected " +
                                    (op == store_op::add ? "8" : "0") + ")");
  return body;
}
}  // namespace detail

// Serves the store on host:port (port 0: any free port; see port()) until destroyed.
class store_server {
 public:
  store_server(const std::string& host, std::uint16_t port, std::string_view job_token)
      : token_hash_(support::wire::token_hash(job_token)),
        acceptor_(support::listen(io_, host, port, "the rendezvous store's port (MASTER_PORT)")),
        work_(io_.get_executor()),
        port_(acceptor_.local_endpoint().port()) {  // read here: the server thread owns the acceptor from now on
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;
  ~store_server() {
    io_.stop();
    thread_.join();
  }

  std::uint16_t port() const noexcept { return port_; }

 private:
  using tcp = detail::tcp;
  // One client connection: read a request, answer it (a get may wait for its key), repeat.
  struct session : std::enable_shared_from_this<session> {
    session(store_server& s, tcp::socket sock) : server(s), socket(std::move(sock)) {}
    store_server& server;
    tcp::socket socket;
    detail::wire::header_bytes header{};
    detail::wire::frame_header request;
    std::vector<std::byte> payload;
    detail::wire::header_bytes reply_header{};
    std::vector<std::byte> reply;
    static constexpr std::string_view who = "a rendezvous client";

    void read_request() {
      auto self = shared_from_this();
      detail::asio::async_read(socket, detail::asio::buffer(header), [self](const boost::system::error_code& ec, std::size_t) {
        if (ec) return;  // the client went away: nothing to answer
        try {
          self->request = detail::decode_store_request_header(self->header, self->server.token_hash_, who);
        } catch (const error& e) {
          self->refuse(e.what());
          return;
        }
        self->payload.resize(static_cast<std::size_t>(self->request.length));
        detail::asio::async_read(self->socket, detail::asio::buffer(self->payload),
                                 [self](const boost::system::error_code& ec2, std::size_t) {
                                   if (!ec2) self->handle();
                                 });
      });
    }

    void handle() {
      detail::store_request r;
      try {
        r = detail::parse_store_request(request, payload, who);
      } catch (const error& e) {
        return refuse(e.what());
      }
      const std::string& key = r.key;
      const std::span<const std::byte> value = r.value;
      auto& values = server.values_;
      switch (r.op) {
        case detail::store_op::set: {
          values[key].assign(value.begin(), value.end());
          answer({});
          // Wake the gets that waited for this key.
          auto [first, last] = server.waiting_.equal_range(key);
          std::vector<std::shared_ptr<session>> woken;
          for (auto it = first; it != last; ++it) woken.push_back(it->second);
          server.waiting_.erase(first, last);
          for (auto& w : woken) w->answer(values[key]);
          return;
        }
        case detail::store_op::get: {
          auto it = values.find(key);
          if (it != values.end()) return answer(it->second);
          server.waiting_.emplace(key, shared_from_this());  // answered by the set
          // A client that gives up (its timeout) or dies while waiting hangs up: forget it.
          auto self = shared_from_this();
          socket.async_wait(tcp::socket::wait_read, [self, key](const boost::system::error_code&) {
            boost::system::error_code ec;
            if (self->socket.available(ec) > 0 && !ec) return;  // a request (not a hang-up)
            auto [first, last] = self->server.waiting_.equal_range(key);
            for (auto w = first; w != last;)
              w = w->second == self ? self->server.waiting_.erase(w) : std::next(w);
          });
          return;
        }
        case detail::store_op::add: {
          std::int64_t x = detail::as_int(values[key]) + detail::as_int(value);
          auto& stored = values[key];
          stored.resize(8);
          std::memcpy(stored.data(), &x, 8);
          answer(stored);
          return;
        }
      }
    }

    void answer(std::span<const std::byte> value) {
      detail::wire::frame_header h;
      h.kind = detail::wire::frame_kind::store_reply;
      h.token_hash = server.token_hash_;
      h.length = value.size();
      reply_header = detail::wire::encode(h);
      reply.assign(value.begin(), value.end());
      auto self = shared_from_this();
      const std::array<detail::asio::const_buffer, 2> buffers{detail::asio::buffer(reply_header),
                                                              detail::asio::buffer(reply)};
      detail::asio::async_write(socket, buffers, [self](const boost::system::error_code& ec, std::size_t) {
        if (!ec) self->read_request();
      });
    }

    // Says why in a refuse frame (the client turns it into its error), then hangs up.
    void refuse(const std::string& why) {
      detail::wire::frame_header h;
      h.kind = detail::wire::frame_kind::refuse;
      h.token_hash = server.token_hash_;
      h.length = why.size();
      reply_header = detail::wire::encode(h);
      reply.resize(why.size());
      std::memcpy(reply.data(), why.data(), why.size());
      auto self = shared_from_this();
      const std::array<detail::asio::const_buffer, 2> buffers{detail::asio::buffer(reply_header),
                                                              detail::asio::buffer(reply)};
      detail::asio::async_write(socket, buffers, [self](const boost::system::error_code&, std::size_t) {
        boost::system::error_code ignored;
        self->socket.shutdown(tcp::socket::shutdown_both, ignored);
      });
    }
  };

  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == detail::asio::error::operation_aborted) return;
      if (!ec) {
        boost::system::error_code ignored;  // on this thread a throw would end the job's rank 0
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<session>(*this, std::move(socket))->read_request();
      }
      accept();
    });
  }

  const std::uint64_t token_hash_;
  detail::asio::io_context io_;
  tcp::acceptor acceptor_;
  detail::asio::executor_work_guard<detail::asio::io_context::executor_type> work_;
  std::uint16_t port_;
  std::map<std::string, std::vector<std::byte>> values_;                   // only touched on thread_
  std::multimap<std::string, std::shared_ptr<session>> waiting_;         // gets waiting for a set
  std::thread thread_;
};

// A client of the store; every call blocks until answered or until its timeout.
class store_client {
 public:
  // Connects, retrying while the server is not up yet (rank 0 may start last).
  store_client(const std::string& host, std::uint16_t port, std::string_view job_token,
               std::chrono::milliseconds timeout = default_timeout)
      : token_hash_(support::wire::token_hash(job_token)),
        where_("the rendezvous store at " + support::address_text(host, port)),
        timeout_(timeout),
        socket_(support::connect_with_retry(io_, host, port, "the rendezvous store (MASTER_ADDR:MASTER_PORT)",
                                                      deadline_after(timeout))) {}

  void set(const std::string& key, std::span<const std::byte> value) { call(detail::store_op::set, key, value); }
  void set(const std::string& key, const std::string& value) {
    set(key, std::as_bytes(std::span(value.data(), value.size())));
  }
  // Waits until some rank has set `key`, then returns its value.
  std::vector<std::byte> get(const std::string& key) { return call(detail::store_op::get, key, {}); }
  std::string get_string(const std::string& key) {
    const auto v = get(key);
    return std::string(reinterpret_cast<const char*>(v.data()), v.size());
  }
  // Adds delta to the integer under `key` (0 if unset) and returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    return detail::as_int(call(detail::store_op::add, key, std::as_bytes(std::span(&delta, 1))));
  }
  // Waits until every key is set.
  void wait(std::span<const std::string> keys) {
    for (const auto& k : keys) get(k);
  }

  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // This end's address on the connection to the store: the interface through which the
  // master, and so most likely every other rank, reaches this process.
  std::string local_address() const { return socket_.local_endpoint().address().to_string(); }

 private:
  std::vector<std::byte> call(detail::store_op op, const std::string& key, std::span<const std::byte> value) {
    if (value.size() > detail::max_store_value)
      throw error(errc::invalid_argument, "store: value of " + std::to_string(value.size()) + " bytes for '" + key +
                                              "' exceeds the limit of " + std::to_string(detail::max_store_value));
    if (!socket_.is_open()) throw error(errc::peer_lost, where_ + ": the connection was closed by an earlier error");
    const auto until = deadline_after(timeout_);
    detail::wire::frame_header h;
    h.kind = detail::wire::frame_kind::store_request;
    h.tag = static_cast<std::uint64_t>(op);
    h.token_hash = token_hash_;
    const auto payload = detail::pack(key, value);
    h.length = payload.size();
    try {
      detail::write_frame(io_, socket_, h, payload, until, where_);
      auto [reply, body] = detail::read_frame(io_, socket_, token_hash_, until, where_,
                                                         detail::max_store_value);
      return detail::parse_store_reply(reply, std::move(body), op, where_);
    } catch (const error& e) {
      socket_.close();  // a half-finished exchange leaves the stream unusable
      if (e.kind() == errc::timeout && op == detail::store_op::get)
        throw error(errc::timeout, "rendezvous: nobody set '" + key + "' in " + where_ + " within " +
                                       std::to_string(timeout_.count()) + " ms: did every rank start?");
      throw;
    }
  }

  const std::uint64_t token_hash_;
  std::string where_;
  std::chrono::milliseconds timeout_;
  detail::asio::io_context io_;
  detail::tcp::socket socket_;
};

}  // namespace gradwire::rendezvous
