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

#include "../concepts.hpp"
#include "../config.hpp"
#include "../error.hpp"
#include "../support/asio.hpp"
#include "../support/wire.hpp"
#include "../timeouts.hpp"
#include "framed_io.hpp"
#include "store_text.hpp"

namespace gradwire::rendezvous {

namespace detail {

enum class store_op : std::uint64_t { set = 1, get = 2, add = 3 };
inline constexpr std::size_t max_store_value = std::size_t{64} << 20;

// Request payload: u32 key length, key, value.
GRADWIRE_DECL std::vector<std::byte> pack(const std::string& key, std::span<const std::byte> value);

GRADWIRE_DECL std::int64_t as_int(std::span<const std::byte> v);

// A request as the server reads it; `value` views the payload it was parsed from.
struct store_request {
  store_op op{};
  std::string key;
  std::span<const std::byte> value;
};

// The server's checks of a request's header, before it reads the payload: a frame of
// this job (decode), a store request, and a payload within the store's limit.
GRADWIRE_DECL wire::frame_header decode_store_request_header(std::span<const std::byte> header, std::uint64_t token_hash,
                                                      std::string_view who);

// Parses a request's payload (see pack): u32 key length, key, value; the request kind is
// the header's tag. errc::protocol naming `who` for anything else.
GRADWIRE_DECL store_request parse_store_request(const wire::frame_header& h, std::span<const std::byte> payload,
                                         std::string_view who);

// The value of the server's answer to a request of kind `op` (frame header `h`, payload
// `body`); a refusal becomes the server's reason as an error (auth when it names the job
// token, then saying that the store is most likely another job's on the same port),
// anything else errc::protocol naming `where`.
GRADWIRE_DECL std::vector<std::byte> parse_store_reply(const wire::frame_header& h, std::vector<std::byte> body,
                                                store_op op, const std::string& where);
}  // namespace detail

// Serves the store on host:port (port 0: any free port; see port()) until destroyed.
class store_server {
 public:
  GRADWIRE_DECL store_server(const std::string& host, std::uint16_t port, std::string_view job_token);
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;
  GRADWIRE_DECL ~store_server();

  std::uint16_t port() const noexcept { return port_; }

 private:
  using tcp = detail::tcp;
  // One client connection: read a request, answer it (a get may wait for its key), repeat.
  struct session;

  GRADWIRE_DECL void accept();

  const std::uint64_t token_hash_;
  detail::asio::io_context io_;
  tcp::acceptor acceptor_;
  detail::asio::executor_work_guard<detail::asio::io_context::executor_type> work_;
  std::uint16_t port_;
  std::map<std::string, std::vector<std::byte>> values_;                   // only touched on thread_
  std::multimap<std::string, std::shared_ptr<session>> waiting_;         // gets waiting for a set
  std::thread thread_;
};

// A client of the store; every call blocks until answered or until its timeout. Its set,
// get and set_timeout are concepts::rendezvous_store: what joining needs from a store.
class store_client {
 public:
  // Connects, retrying while the server is not up yet (rank 0 may start last).
  GRADWIRE_DECL store_client(const std::string& host, std::uint16_t port, std::string_view job_token,
                             std::chrono::milliseconds timeout = default_timeout);

  void set(const std::string& key, std::span<const std::byte> value) { call(detail::store_op::set, key, value); }
  void set(const std::string& key, const std::string& value) { set_text(*this, key, value); }
  // Waits until some rank has set `key`, then returns its value.
  std::vector<std::byte> get(const std::string& key) { return call(detail::store_op::get, key, {}); }
  std::string get_string(const std::string& key) { return get_text(*this, key); }
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
  GRADWIRE_DECL std::vector<std::byte> call(detail::store_op op, const std::string& key, std::span<const std::byte> value);

  const std::uint64_t token_hash_;
  std::string where_;
  std::chrono::milliseconds timeout_;
  detail::asio::io_context io_;
  detail::tcp::socket socket_;
};
static_assert(concepts::rendezvous_store<store_client>);

}  // namespace gradwire::rendezvous

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/asio.cpp (config.hpp)
#include "store.ipp"
#endif
