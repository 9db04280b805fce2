// The rendezvous store's definitions (store.hpp): compiled once in src/asio.cpp, or included by store.hpp
// in header-only mode (config.hpp).
#pragma once

#include <array>
#include <cstring>
#include <iterator>
#include <memory>

#include "store.hpp"

namespace gradwire::rendezvous {

namespace detail {

GRADWIRE_DECL std::vector<std::byte> pack(const std::string& key, std::span<const std::byte> value) {
  std::vector<std::byte> out(4 + key.size() + value.size());
  const auto length = static_cast<std::uint32_t>(key.size());
  std::memcpy(out.data(), &length, 4);
  std::memcpy(out.data() + 4, key.data(), key.size());
  if (!value.empty()) std::memcpy(out.data() + 4 + key.size(), value.data(), value.size());
  return out;
}

GRADWIRE_DECL std::int64_t as_int(std::span<const std::byte> v) {
  std::int64_t x = 0;
  if (v.size() == 8) std::memcpy(&x, v.data(), 8);
  return x;
}

GRADWIRE_DECL wire::frame_header decode_store_request_header(std::span<const std::byte> header, std::uint64_t token_hash,
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

GRADWIRE_DECL store_request parse_store_request(const wire::frame_header& h, std::span<const std::byte> payload,
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

// A store of another job (its answer carries, or its refusal names, another job token):
// most often two jobs on one host given the same MASTER_PORT, the second's rank 0 unable
// to listen on it and its other ranks reaching the first job's store. Says that first,
// then the token.
inline error another_jobs_store(const std::string& where) {
  return error(errc::auth, where + " (MASTER_ADDR:MASTER_PORT) belongs to another job (it refused this rank's job "
                                   "token): most likely another job already uses that port: give this job a "
                                   "different MASTER_PORT; or, if it is this job's own store, its ranks were given "
                                   "different job tokens: give every rank the same GRADWIRE_JOB_TOKEN");
}

GRADWIRE_DECL std::vector<std::byte> parse_store_reply(const wire::frame_header& h, std::vector<std::byte> body,
                                                store_op op, const std::string& where) {
  if (h.kind == wire::frame_kind::refuse) {
    const std::string why(reinterpret_cast<const char*>(body.data()), body.size());
    if (why.find("job token") != std::string::npos) throw another_jobs_store(where);
    throw error(errc::protocol, where + " refused the request: " + why);
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

GRADWIRE_DECL store_server::store_server(const std::string& host, std::uint16_t port, std::string_view job_token)
    : token_hash_(support::wire::token_hash(job_token)),
      acceptor_(support::listen(io_, host, port, "the rendezvous store's port (MASTER_PORT)")),
      work_(io_.get_executor()),
      port_(acceptor_.local_endpoint().port()) {  // read here: the server thread owns the acceptor from now on
  accept();
  thread_ = std::thread([this] { io_.run(); });
}

GRADWIRE_DECL store_server::~store_server() {
  io_.stop();
  thread_.join();
}

struct store_server::session : std::enable_shared_from_this<session> {
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

GRADWIRE_DECL void store_server::accept() {
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

GRADWIRE_DECL store_client::store_client(const std::string& host, std::uint16_t port, std::string_view job_token,
             std::chrono::milliseconds timeout)
    : token_hash_(support::wire::token_hash(job_token)),
      where_("the rendezvous store at " + support::address_text(host, port)),
      timeout_(timeout),
      socket_(support::connect_with_retry(io_, host, port, "the rendezvous store (MASTER_ADDR:MASTER_PORT)",
                                                    clock::now() + timeout)) {}

GRADWIRE_DECL std::vector<std::byte> store_client::call(detail::store_op op, const std::string& key, std::span<const std::byte> value) {
  if (value.size() > detail::max_store_value)
    throw error(errc::invalid_argument, "store: value of " + std::to_string(value.size()) + " bytes for '" + key +
                                            "' exceeds the limit of " + std::to_string(detail::max_store_value));
  if (!socket_.is_open()) throw error(errc::peer_lost, where_ + ": the connection was closed by an earlier error");
  const auto until = clock::now() + timeout_;
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
    // Its answer (a refusal) carries its own job's token, which read_frame refuses.
    if (e.kind() == errc::auth) throw detail::another_jobs_store(where_);
    throw;
  }
}

}  // namespace gradwire::rendezvous
