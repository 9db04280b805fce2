// The rendezvous store's documented failures (docs/errors.md) provoked for real: a key
// nobody sets, a host that never answers, a store that hangs up mid-request, a connect the
// kernel gives up on, a malformed request; and add's totals under concurrent clients.
// Built into test_documented_failures (ctest names "test_documented_failures: rendezvous: ...",
// which the listed mutants select), in a file of its own beside include/gradwire/rendezvous/.
//
// Every wait is bounded by `patience`: a defence that is missing fails its case within
// seconds instead of hanging.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <gradwire/error.hpp>
#include <gradwire/rendezvous/framed_io.hpp>
#include <gradwire/rendezvous/store.hpp>
#include <gradwire/support/asio.hpp>
#include <gradwire/support/wire.hpp>
#include <gradwire/timeouts.hpp>
#include <string>
#include <thread>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;
using gw::errc;
using gradwire::testing::outcome;
using gradwire::testing::outcome_of;
using namespace std::chrono_literals;

namespace {

// Every wait in this file: each connection, each request, each deadline given to gradwire.
constexpr std::chrono::milliseconds patience = 5s;

namespace wire = gradwire::support::wire;

const std::string store_token = "documented-failures";

TEST_CASE("rendezvous: a get of a key nobody sets times out near its timeout, naming the key, the store and the time") {
  gw::rendezvous::store_server server("127.0.0.1", 0, store_token);
  const std::string where = "the rendezvous store at " + gw::support::address_text("127.0.0.1", server.port());
  constexpr auto timeout = 300ms;
  gw::rendezvous::store_client client("127.0.0.1", server.port(), store_token, timeout);
  client.set("gradwire/present", "here");
  REQUIRE(client.get_string("gradwire/present") == "here");  // the store answers: only the key is missing
  const auto began = std::chrono::steady_clock::now();
  const outcome o = outcome_of([&] { client.get("gradwire/tcp/3"); });
  const auto took = std::chrono::steady_clock::now() - began;
  CAPTURE(o.what);
  REQUIRE(o.kind == errc::timeout);
  REQUIRE_THAT(o.what, Catch::StartsWith("rendezvous: nobody set 'gradwire/tcp/3' in " + where +
                                         " within 300 ms: did every rank start?"));
  REQUIRE(took >= timeout);
  REQUIRE(took < timeout + patience);
  // Another client still gets what was set: the store lives on.
  gw::rendezvous::store_client other("127.0.0.1", server.port(), store_token, patience);
  REQUIRE(other.get_string("gradwire/present") == "here");
}

// A listener that never answers a connection attempt: it never accepts, and one
// connection (the filler) already waits in its accept queue of one (listen backlog 0).
// Linux then drops every further SYN, so a connect to it is neither accepted nor refused:
// it hangs, as one to a host behind a firewall that drops packets, or one that is gone.
struct unanswering_listener {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor{io};
  boost::asio::ip::tcp::socket filler{io};
  unanswering_listener() {
    namespace ip = boost::asio::ip;
    acceptor.open(ip::tcp::v4());
    acceptor.bind({ip::make_address("127.0.0.1"), 0});
    acceptor.listen(0);
    filler.connect(acceptor.local_endpoint());
  }
  std::uint16_t port() const { return acceptor.local_endpoint().port(); }
};

std::string unanswered_message(std::uint16_t port) {
  return "could not connect to the rendezvous store (MASTER_ADDR:MASTER_PORT) at " +
         gw::support::address_text("127.0.0.1", port) + " before the deadline: is it running, and is the address right?";
}

TEST_CASE("rendezvous: add starts an unset key at 0 and returns each new total, every add of concurrent clients "
          "counted once") {
  gw::rendezvous::store_server server("127.0.0.1", 0, store_token);
  gw::rendezvous::store_client client("127.0.0.1", server.port(), store_token, patience);
  REQUIRE(client.add("gradwire/count", 5) == 5);
  REQUIRE(client.add("gradwire/count", -7) == -2);
  REQUIRE(client.add("gradwire/unset", 0) == 0);
  // 4 clients on their own threads add 1, 2, ..., 50 each: the totals they are told are
  // all different (each add is atomic) and the last is the serial sum.
  constexpr int clients = 4, adds = 50;
  std::vector<std::vector<std::int64_t>> told(clients);
  std::vector<std::exception_ptr> errors(clients);
  {
    std::vector<std::jthread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        try {
          gw::rendezvous::store_client mine("127.0.0.1", server.port(), store_token, patience);
          for (int i = 1; i <= adds; ++i) told[c].push_back(mine.add("gradwire/count", i));
        } catch (...) {
          errors[c] = std::current_exception();
        }
      });
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  const std::int64_t total = -2 + clients * (adds * (adds + 1) / 2);
  std::vector<std::int64_t> all;
  for (const auto& t : told) all.insert(all.end(), t.begin(), t.end());
  std::sort(all.begin(), all.end());
  REQUIRE(std::adjacent_find(all.begin(), all.end()) == all.end());
  REQUIRE(all.back() == total);
  REQUIRE(client.add("gradwire/count", 0) == total);
  // A get reads the total as the 8 bytes of an int64.
  const auto bytes = client.get("gradwire/count");
  REQUIRE(bytes.size() == 8);
  std::int64_t read = 0;
  std::memcpy(&read, bytes.data(), 8);
  REQUIRE(read == total);
}

TEST_CASE("rendezvous: a store host that never answers the connection is a timeout at the deadline, naming it and what to check") {
  const unanswering_listener store;
  constexpr auto timeout = 300ms;
  const auto began = std::chrono::steady_clock::now();
  const outcome o = outcome_of([&] { gw::rendezvous::store_client client("127.0.0.1", store.port(), store_token, timeout); });
  const auto took = std::chrono::steady_clock::now() - began;
  CAPTURE(o.what);
  REQUIRE(o.kind == errc::timeout);
  REQUIRE_THAT(o.what, Catch::StartsWith(unanswered_message(store.port())));
  REQUIRE(took >= timeout);
  REQUIRE(took < timeout + patience);
}

TEST_CASE("rendezvous: a store that hangs up while a request is sent is a lost connection while sending, naming the "
          "store and the reason") {
  // The "store" accepts and closes at once. 32 MiB (under the store's 64 MiB limit) cannot
  // all go into the kernel's buffers before the closed socket answers the first bytes with a
  // reset, so the write itself fails, not the read of the reply after it.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acceptor.local_endpoint().port();
  gw::rendezvous::store_client client("127.0.0.1", port, store_token, patience);
  acceptor.accept().close();  // the client's connection, waiting in the backlog
  const std::string value(32u << 20, 'v');
  const outcome o = outcome_of([&] { client.set("k", value); });
  CAPTURE(o.what);
  REQUIRE(o.kind == errc::peer_lost);
  const std::string store = "the rendezvous store at 127\\.0\\.0\\.1:" + std::to_string(port);
  REQUIRE_THAT(o.what, Catch::Matches("lost the connection to " + store + " while sending: [A-Za-z].*"));  // a reason
  // The stream is unusable after a half-sent frame: the next call says so at once.
  const outcome next = outcome_of([&] { client.set("k", "v"); });
  REQUIRE(next.kind == errc::peer_lost);
  REQUIRE_THAT(next.what, Catch::Matches(store + ": the connection was closed by an earlier error.*"));
}

// Run by tests/helpers/in_netns.py with net.ipv4.tcp_syn_retries=1 (hidden: the host's
// 6 retries would take 2 minutes): the kernel gives up on a connection attempt after 3 s
// (ETIMEDOUT), which is not the last word before the deadline: like a refusal, it is
// retried, and the caller gets the timeout at its deadline, not a config error at 3 s.
TEST_CASE("rendezvous: a connection attempt the kernel gives up on is retried until the deadline, then is a timeout", "[.netns]") {
  std::ifstream retries_file("/proc/sys/net/ipv4/tcp_syn_retries");
  int retries = -1;
  retries_file >> retries;
  INFO("run by tests/helpers/in_netns.py --sysctl net.ipv4.tcp_syn_retries=1");
  REQUIRE(retries == 1);  // SYNs at 0 and 1 s, ETIMEDOUT at 3 s
  const unanswering_listener store;
  constexpr auto timeout = 5s;  // past the kernel's 3 s
  const outcome o = outcome_of([&] { gw::rendezvous::store_client client("127.0.0.1", store.port(), store_token, timeout); });
  CAPTURE(o.what);
  REQUIRE(o.kind == errc::timeout);
  REQUIRE_THAT(o.what, Catch::StartsWith(unanswered_message(store.port())));
}

TEST_CASE("rendezvous: a store request whose key length does not fit its payload is refused with protocol, naming the payload size") {
  gw::rendezvous::store_server server("127.0.0.1", 0, store_token);
  namespace rz = gw::rendezvous::detail;
  boost::asio::io_context io;
  auto socket = gw::support::connect_with_retry(io, "127.0.0.1", server.port(), "the store", gw::clock::now() + patience);
  // A well-formed header (this job's token, a get) over an 8-byte payload whose key
  // length says 100 bytes follow.
  std::vector<std::byte> payload(8, std::byte{'k'});
  const std::uint32_t key_length = 100;
  std::memcpy(payload.data(), &key_length, 4);
  wire::frame_header h;
  h.kind = wire::frame_kind::store_request;
  h.tag = static_cast<std::uint64_t>(rz::store_op::get);
  h.token_hash = wire::token_hash(store_token);
  h.length = payload.size();
  const std::string where = "the store";
  rz::write_frame(io, socket, h, payload, gw::clock::now() + patience, where);
  auto [reply, body] = rz::read_frame(io, socket, wire::token_hash(store_token), gw::clock::now() + patience, where);
  REQUIRE(reply.kind == wire::frame_kind::refuse);
  // What a store_client makes of that answer.
  const outcome o = outcome_of([&] { rz::parse_store_reply(reply, body, rz::store_op::get, where); });
  CAPTURE(o.what);
  REQUIRE(o.kind == errc::protocol);
  REQUIRE_THAT(o.what, Catch::StartsWith("the store refused the request: malformed store request from a rendezvous "
                                         "client: its key length does not fit its 8-byte payload"));
  // The server hangs up on that client, and serves the others.
  const outcome after = outcome_of([&] { rz::read_frame(io, socket, h.token_hash, gw::clock::now() + patience, where); });
  REQUIRE(after.kind == errc::peer_lost);
  gw::rendezvous::store_client client("127.0.0.1", server.port(), store_token, patience);
  client.set("k", "v");
  REQUIRE(client.get_string("k") == "v");
}

}  // namespace
