// asio_tcp's defences provoked on real sockets: corrupted payloads and headers, another job's token, a stranger, a peer that finishes, stall reports.
//
// Two ranks run as threads of this process over loopback. Where the wire must be
// touched, rank 1 dials rank 0 through a man-in-the-middle proxy owned by the test
// (helpers/mitm_proxy.hpp): the test reads the address rank 0 published in the
// rendezvous store, starts the proxy towards it and publishes the proxy's address in its
// place, and only then starts rank 1, which so reads the proxy's. The proxy flips a
// payload byte, rewrites a header or puts a forged frame ahead of a real one, and counts
// what it did, so no test passes without the wire having been touched. Every wait is
// bounded by `patience`: a defence that is missing fails its test within seconds.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/observe/activity.hpp>
#include <gradwire/rendezvous/store.hpp>
#include <gradwire/support/asio.hpp>
#include <gradwire/support/wire.hpp>
#include <gradwire/transport/asio_tcp.hpp>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "helpers/event.hpp"
#include "helpers/mitm_proxy.hpp"
#include "helpers/reference.hpp"

namespace gw = gradwire;
namespace wire = gradwire::support::wire;
using gw::errc;
using gw::test::is_error;
using gw::testing::frame_edit;
using gw::testing::mitm_proxy;
using gw::transport::asio_tcp;
using gw::transport::asio_tcp_options;
using namespace std::chrono_literals;

namespace {

// Every wait in this file: the join, each receive, each hand-over between the threads.
constexpr std::chrono::milliseconds patience = 5s;
const std::string job_token = "tcp-defences";
const std::string foreign_token = "another-job";

// A port that was free a moment ago, for a rendezvous store.
std::uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

using gradwire::testing::event;  // ordered without sleeping, within 5 s

// The gradwire::error `fn` throws, if it throws one.
template <class Fn>
std::optional<gw::error> failure_of(Fn&& fn) {
  try {
    fn();
  } catch (const gw::error& e) {
    return e;
  }
  return std::nullopt;
}

void finish(asio_tcp& t, asio_tcp::request& r) { t.wait(r, gw::clock::now() + patience); }

// Rank 1's side of most cases: sends `data` to rank 0 (tag 7), then waits for rank 0's
// one-byte answer (tag 99), which a rank 0 that failed never sends.
void send_and_await_answer(asio_tcp& t, std::span<const float> data) {
  auto s = t.async_send(0, 7, std::as_bytes(data));
  finish(t, s);
  std::byte answer{};
  auto a = t.async_recv(0, 99, {&answer, 1});
  finish(t, a);
}

// As the message texts write CRCs, formatted here on its own.
std::string hex(std::uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

std::uint32_t crc_of(const std::vector<float>& v) { return wire::crc32c(std::as_bytes(std::span(v))); }

// A 2-rank asio_tcp job on two threads of this process.
class two_ranks {
 public:
  explicit two_ranks(bool checksum = true) : checksum_(checksum) {}

  asio_tcp_options options(int rank) const {
    asio_tcp_options o;
    o.rank = rank;
    o.size = 2;
    o.job_token = job_token;
    o.store_port = store_port_;
    o.connect_timeout = patience;
    o.checksum_payload = checksum_;
    return o;
  }

  // Runs rank0(transport) and rank1(transport) on their own threads, rank 1 dialling rank 0
  // through a proxy made with `tamper` (held until release() when `held`). `meanwhile`
  // runs on this thread once rank 1 has started; the proxy is released after it. Rethrows
  // what the setup, `meanwhile` or a rank threw.
  template <class F0, class F1, class M>
  void run_through_proxy(mitm_proxy::tamper_fn tamper, F0 rank0, F1 rank1, bool held, M meanwhile) {
    std::exception_ptr errors[3];
    std::thread t0 = start(0, rank0, errors[0]), t1;
    try {
      // Rank 1 starts only once the address it will read is the proxy's.
      gw::rendezvous::store_client store("127.0.0.1", store_port_, job_token, patience);
      rank0_address = gw::support::split_address(store.get_string("gradwire/tcp/0"), "rank 0's address");
      proxy_ = std::make_unique<mitm_proxy>(rank0_address.first, rank0_address.second, std::move(tamper), held);
      store.set("gradwire/tcp/0", gw::support::address_text("127.0.0.1", proxy_->port()));
      t1 = start(1, rank1, errors[1]);
      meanwhile();
    } catch (...) {
      errors[2] = std::current_exception();
    }
    if (proxy_) proxy_->release();
    t0.join();
    if (t1.joinable()) t1.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  template <class F0, class F1>
  void run_through_proxy(mitm_proxy::tamper_fn tamper, F0 rank0, F1 rank1) {
    run_through_proxy(std::move(tamper), rank0, rank1, false, [] {});
  }

  // The same, rank 1 dialling rank 0 directly.
  template <class F0, class F1>
  void run(F0 rank0, F1 rank1) {
    std::exception_ptr errors[2];
    std::thread t0 = start(0, rank0, errors[0]);
    std::thread t1 = start(1, rank1, errors[1]);
    t0.join();
    t1.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  mitm_proxy& proxy() { return *proxy_; }
  std::pair<std::string, std::uint16_t> rank0_address;  // where rank 0 really listens

 private:
  template <class F>
  std::thread start(int rank, F& fn, std::exception_ptr& error) {
    return std::thread([this, rank, &fn, &error] {
      try {
        asio_tcp t(options(rank));
        fn(t);
      } catch (...) {
        error = std::current_exception();
      }
    });
  }

  bool checksum_;
  std::uint16_t store_port_ = free_port();
  std::unique_ptr<mitm_proxy> proxy_;  // outlives the ranks' threads
};

// Tamper functions: each acts on the first data frame with `tag` and leaves the rest alone.
template <class Edit>
mitm_proxy::tamper_fn on_first_data_frame(std::uint64_t tag, Edit edit) {
  return [tag, edit, done = false](wire::header_bytes& bytes) mutable -> frame_edit {
    const auto h = wire::decode(bytes, wire::token_hash(job_token), "the proxy's sender");
    if (done || h.kind != wire::frame_kind::data || h.tag != tag) return {};
    done = true;
    return edit(bytes);
  };
}

mitm_proxy::tamper_fn flip_payload_byte(std::uint64_t tag, std::uint64_t offset) {
  return on_first_data_frame(tag, [offset](wire::header_bytes&) {
    frame_edit e;
    e.flip_payload_byte = offset;
    return e;
  });
}

// --- payload checksums ----------------------------------------------------------------

// The receive paths of transport/tcp/receive.ipp that check a payload's CRC.
enum class receive_path {
  whole,         // a small message, taken whole from the frame buffer (on_buffered_frame)
  eager,         // a medium one that arrives before its receive: read into memory (read_eager)
  in_place,      // a large one whose receive waits: read straight into place (read_in_place)
  accumulating,  // async_recv_accumulate of a large one: chunks added as they land (read_accumulating)
};

struct corruption_outcome {
  std::optional<gw::error> received;  // rank 0's receive (eager: the receive it waited on meanwhile)
  std::optional<gw::error> later;     // eager: rank 0's receive of the corrupted message itself, posted after
  std::optional<gw::error> sender;    // rank 1: its send, then a wait for rank 0's answer
  std::vector<float> sent, before, got;  // rank 0's buffer before and after (accumulating: added into)
};

// Rank 1 sends `count` random floats with tag 7 to rank 0 through a proxy that inverts
// payload byte `flip`; rank 0 receives them by `path`.
corruption_outcome send_corrupted(receive_path path, std::size_t count, std::uint64_t flip, bool checksum,
                                  two_ranks& job, gw::test::random_engine& rng) {
  corruption_outcome out;
  out.sent = rng.vector<float>(count);
  out.before = path == receive_path::accumulating ? rng.vector<float>(count) : std::vector<float>(count, 0.0f);
  event posted;
  auto rank0 = [&](asio_tcp& t) {
    std::vector<float> buffer = out.before;
    std::vector<float> follow(4);
    if (path == receive_path::eager) {
      // Waiting for a later message runs the link while tag 7 arrives with no receive posted.
      auto r = t.async_recv(1, 8, std::as_writable_bytes(std::span(follow)));
      posted.raise();
      out.received = failure_of([&] { finish(t, r); });
      out.later = failure_of([&] {
        auto m = t.async_recv(1, 7, std::as_writable_bytes(std::span(buffer)));
        finish(t, m);
      });
    } else {
      auto r = path == receive_path::accumulating
                   ? t.async_recv_accumulate(1, 7, std::span(buffer))
                   : t.async_recv(1, 7, std::as_writable_bytes(std::span(buffer)));
      posted.raise();
      out.received = failure_of([&] { finish(t, r); });
    }
    out.got = buffer;
    if (!out.received && !out.later) {
      const std::byte answer{1};
      auto a = t.async_send(1, 99, {&answer, 1});
      finish(t, a);
    }
  };
  auto rank1 = [&](asio_tcp& t) {
    posted.await("rank 0's receive");
    out.sender = failure_of([&] {
      auto s = t.async_send(0, 7, std::as_bytes(std::span(out.sent)));
      finish(t, s);
      if (path == receive_path::eager && !checksum) {  // what rank 0 waits for meanwhile (with checksums, it fails first)
        const std::vector<float> next(4, 1.0f);
        auto n = t.async_send(0, 8, std::as_bytes(std::span(next)));
        finish(t, n);
      }
      std::byte answer{};
      auto a = t.async_recv(0, 99, {&answer, 1});
      finish(t, a);
    });
  };
  job.run_through_proxy(flip_payload_byte(7, flip), rank0, rank1);
  return out;
}

// Runs one path with and without payload checksums (SECTIONs of the calling TEST_CASE).
void check_corruption_is_caught(receive_path path, std::size_t count, std::uint64_t flip) {
  REQUIRE(flip % 4 == 1);  // a mantissa byte: the corrupted float stays finite, so it compares
  GRADWIRE_TEST_RNG(rng);
  const std::size_t bytes = count * sizeof(float);
  SECTION("with payload checksums the receive fails with protocol naming rank, tag and size") {
    two_ranks job(true);
    const auto out = send_corrupted(path, count, flip, true, job, rng);
    REQUIRE(job.proxy().flipped_bytes() == 1);
    std::vector<float> corrupted = out.sent;
    reinterpret_cast<std::byte*>(corrupted.data())[flip] ^= std::byte{0xff};
    const std::string expected = "rank 0: corrupt payload from rank 1 (tag 7, " + std::to_string(bytes) +
                                 " bytes): checksum " + hex(crc_of(corrupted)) + ", header says " + hex(crc_of(out.sent));
    REQUIRE(out.received.has_value());
    CHECK_THAT(*out.received, is_error(errc::protocol, {"corrupt payload from rank 1 (tag 7, " + std::to_string(bytes) + " bytes)"}));
    CHECK(out.received->details() == expected);
    if (path == receive_path::eager) {  // nor can the corrupted message be received afterwards
      REQUIRE(out.later.has_value());
      CHECK(out.later->kind() == errc::protocol);
      CHECK(out.later->details() == expected);
    }
    // The sender is not left waiting, and it learns why: rank 0's abort frame goes out on
    // the link it lost too, ahead of the close.
    REQUIRE(out.sender.has_value());
    CHECK_THAT(*out.sender, is_error(errc::peer_lost, {"rank 1: rank 0 failed: " + expected}));
  }
  SECTION("without payload checksums the same corruption arrives silently, in exactly the flipped byte") {
    // What the checksum is for: the proxy really changed that one payload byte.
    two_ranks job(false);
    const auto out = send_corrupted(path, count, flip, false, job, rng);
    REQUIRE(job.proxy().flipped_bytes() == 1);
    REQUIRE_FALSE(out.received.has_value());
    REQUIRE_FALSE(out.later.has_value());
    REQUIRE_FALSE(out.sender.has_value());
    std::vector<float> corrupted = out.sent;
    reinterpret_cast<std::byte*>(corrupted.data())[flip] ^= std::byte{0xff};
    std::size_t wrong = 0, differs = 0, where = count;
    for (std::size_t i = 0; i < count; ++i) {
      // Reference in float64: the sum of two floats is exact there, rounded once to float.
      const double clean = double(out.before[i]) + double(out.sent[i]);
      const double tampered = double(out.before[i]) + double(corrupted[i]);
      if (out.got[i] != float(tampered)) ++wrong;
      if (out.got[i] != float(clean)) ++differs, where = i;
    }
    CHECK(wrong == 0);  // what arrived is what the proxy forwarded
    CHECK(differs == 1);  // and that differs from what was sent in the one float holding the flipped byte
    CHECK(where == flip / 4);
  }
}

}  // namespace

TEST_CASE("a payload byte corrupted on the wire: a small message, taken whole from the frame buffer",
          "[tcp][defences][checksum]") {
  check_corruption_is_caught(receive_path::whole, 1000, 1233);
}

TEST_CASE("a payload byte corrupted on the wire: a medium message that arrives before its receive, read eagerly",
          "[tcp][defences][checksum]") {
  // 100 KiB: more than the 64 KiB frame buffer takes in one read, less than eager_bytes.
  check_corruption_is_caught(receive_path::eager, 25600, 25600 * 4 - 3);
}

TEST_CASE("a payload byte corrupted on the wire: a large message read straight into place, corrupted far into it",
          "[tcp][defences][checksum]") {
  // 3 MiB and a little: past the frame buffer and the early buffer (early_bytes, 1 MiB).
  const std::size_t count = (std::size_t{3} << 20) / 4 + 5;
  check_corruption_is_caught(receive_path::in_place, count, count * 4 - 7);
}

TEST_CASE("a payload byte corrupted on the wire: an accumulating receive (recv-and-add), corrupted in its last chunk",
          "[tcp][defences][checksum]") {
  const std::size_t count = (std::size_t{3} << 20) / 4 + 5;
  check_corruption_is_caught(receive_path::accumulating, count, count * 4 - 7);
}

// --- the job token ----------------------------------------------------------------------

namespace {

// Reads up to bytes.size() bytes from `fd`, each within patience; returns how many came
// before the connection ended.
std::size_t read_within_patience(int fd, std::span<std::byte> bytes) {
  std::size_t got = 0;
  const auto until = std::chrono::steady_clock::now() + patience;
  while (got < bytes.size()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      throw std::runtime_error("the socket stayed silent for " + std::to_string(patience.count()) + " ms");
    const ssize_t n = ::recv(fd, bytes.data() + got, bytes.size() - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

// A process that connects to `address` and says hello as rank `source` of a 2-rank job
// with `token`'s hash: by default a process of another job, as rank 1.
class stranger {
 public:
  explicit stranger(const std::pair<std::string, std::uint16_t>& address, const std::string& token = foreign_token,
                    std::uint32_t source = 1)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(address.second);
    ::inet_pton(AF_INET, address.first.c_str(), &to.sin_addr);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0)
      throw std::runtime_error("the stranger could not connect to " + address.first + ":" + std::to_string(address.second));
    wire::frame_header hello;
    hello.kind = wire::frame_kind::hello;
    hello.token_hash = wire::token_hash(token);
    hello.source = source;
    hello.tag = 2;  // the world size
    const auto bytes = wire::encode(hello);
    if (::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))
      throw std::runtime_error("the stranger could not say hello");
  }
  ~stranger() { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// A rank's answer to a hello: the header's bytes, the header read with the job's token, and
// the text after it (a refusal's reason).
struct hello_answer {
  wire::header_bytes raw;
  wire::frame_header header;
  std::string text;
};
hello_answer read_answer(int fd, const std::string& from) {
  hello_answer a;
  REQUIRE(read_within_patience(fd, a.raw) == a.raw.size());
  a.header = wire::decode(a.raw, wire::token_hash(job_token), from);
  REQUIRE(a.header.length < 4096);
  a.text.resize(static_cast<std::size_t>(a.header.length));
  REQUIRE(read_within_patience(fd, std::as_writable_bytes(std::span(a.text.data(), a.text.size()))) == a.text.size());
  return a;
}

}  // namespace

TEST_CASE("a stranger with another job's token is refused during the join and its socket closed, and the job still "
          "joins and all-reduces correctly",
          "[tcp][defences][token]") {
  GRADWIRE_TEST_RNG(rng);
  const std::size_t count = 100003;
  const std::vector<std::vector<float>> inputs{rng.vector<float>(count), rng.vector<float>(count)};
  std::vector<std::vector<float>> results(2);
  auto reduce = [&](int rank) {
    return [&, rank](asio_tcp& t) {
      gw::collective::communicator comm(std::move(t), {.timeout = patience});
      results[rank] = inputs[rank];
      gw::collective::all_reduce(comm, std::span(results[rank]));
    };
  };
  two_ranks job;
  std::optional<gw::error> as_stranger_sees_it;
  wire::frame_header refusal;
  std::string reason;
  std::size_t after_refusal = 1;
  // Rank 1's dial is held at the proxy, so rank 0 is still joining (waiting for it) when the
  // stranger's hello comes; the proxy lets rank 1 through once the stranger was answered.
  job.run_through_proxy(
      {}, reduce(0), reduce(1), true, [&] {
        stranger s(job.rank0_address);
        const auto answer = read_answer(s.fd(), "rank 0");
        // A rank of the other job reads rank 0's answer with its own token, as asio_tcp does.
        as_stranger_sees_it = failure_of([&] { wire::decode(answer.raw, wire::token_hash(foreign_token), "rank 0"); });
        refusal = answer.header;
        reason = answer.text;
        std::byte more[16];
        after_refusal = read_within_patience(s.fd(), more);  // 0: rank 0 closed the stranger's socket
      });
  REQUIRE(as_stranger_sees_it.has_value());
  CHECK_THAT(*as_stranger_sees_it,
             is_error(errc::auth, {"frame from rank 0 belongs to another job (job token hash differs): give every rank "
                                   "the same GRADWIRE_JOB_TOKEN"}));
  CHECK(refusal.kind == wire::frame_kind::refuse);
  CHECK(refusal.source == 0);
  CHECK(reason == "wrong job token: give every rank the same GRADWIRE_JOB_TOKEN");
  CHECK(after_refusal == 0);
  // The real rank 1 joined after the refusal, and the collective over the link is right.
  REQUIRE(results[0].size() == count);
  REQUIRE(results[1].size() == count);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const float want = float(double(inputs[0][i]) + double(inputs[1][i]));  // exact in float64, rounded once
    wrong += (results[0][i] != want) + (results[1][i] != want);
  }
  CHECK(wrong == 0);
}

TEST_CASE("a process of the job that dials a rank it may not (itself, a lower rank, a rank outside the job) is "
          "refused naming both ranks, and the job still joins and all-reduces correctly",
          "[tcp][defences][join]") {
  // Only a higher rank dials a lower one. Rank 1 listens while it joins (its dial to rank 0
  // is held at the proxy); hellos with the job's token claiming to come from rank 1 itself,
  // rank 0 and rank 2 of 2 must each be refused, and the job then joins as if none came.
  const std::size_t count = 4099;
  std::vector<std::vector<float>> results(2);
  auto reduce = [&](int rank) {
    return [&, rank](asio_tcp& t) {
      gw::collective::communicator comm(std::move(t), {.timeout = patience});
      results[rank].assign(count, 0.0f);
      for (std::size_t i = 0; i < count; ++i) results[rank][i] = static_cast<float>((rank + 1) * (i % 1000));
      gw::collective::all_reduce(comm, std::span(results[rank]));
    };
  };
  two_ranks job;
  std::vector<std::pair<std::uint32_t, std::string>> refused;
  job.run_through_proxy({}, reduce(0), reduce(1), true, [&] {
    gw::rendezvous::store_client store("127.0.0.1", job.options(0).store_port, job_token, patience);
    const auto rank1 = gw::support::split_address(store.get_string("gradwire/tcp/1"), "rank 1's address");
    for (const std::uint32_t claimed : {1u, 0u, 2u}) {
      stranger s(rank1, job_token, claimed);
      const auto answer = read_answer(s.fd(), "rank 1");
      REQUIRE(answer.header.kind == wire::frame_kind::refuse);
      refused.emplace_back(claimed, answer.text);
    }
  });
  REQUIRE(refused.size() == 3);
  for (const auto& [claimed, reason] : refused) {
    CAPTURE(claimed);
    CHECK(reason == "rank " + std::to_string(claimed) + " cannot dial rank 1 (out of range or already connected)");
  }
  for (std::size_t i = 0; i < count; ++i) {
    CAPTURE(i);
    REQUIRE(results[0][i] == static_cast<float>(3 * (i % 1000)));
    REQUIRE(results[1][i] == results[0][i]);
  }
}

TEST_CASE("a data frame with another job's token, injected into an established link, fails the receive with auth "
          "naming the rank",
          "[tcp][defences][token]") {
  two_ranks job;
  std::vector<float> buffer(16, 0.0f);
  std::optional<gw::error> received, sender;
  event posted;
  auto rank0 = [&](asio_tcp& t) {
    auto r = t.async_recv(1, 7, std::as_writable_bytes(std::span(buffer)));
    posted.raise();
    received = failure_of([&] { finish(t, r); });
  };
  auto rank1 = [&](asio_tcp& t) {
    posted.await("rank 0's receive");
    sender = failure_of([&] { send_and_await_answer(t, std::vector<float>(16, 2.5f)); });
  };
  // Ahead of the real message: a well-formed frame for the same tag, from "rank 1", of another job.
  auto forge = on_first_data_frame(7, [](wire::header_bytes&) {
    wire::frame_header h;
    h.kind = wire::frame_kind::data;
    h.token_hash = wire::token_hash(foreign_token);
    h.tag = 7;
    h.length = 0;
    h.source = 1;
    const auto forged = wire::encode(h);
    frame_edit e;
    e.insert_before.assign(forged.begin(), forged.end());
    return e;
  });
  job.run_through_proxy(forge, rank0, rank1);
  REQUIRE(job.proxy().altered_frames() == 1);
  REQUIRE(received.has_value());
  CHECK_THAT(*received, is_error(errc::auth, {"frame from rank 1 belongs to another job"}));
  CHECK(received->details() ==
        "rank 0: frame from rank 1 belongs to another job (job token hash differs): give every rank the same "
        "GRADWIRE_JOB_TOKEN");
  CHECK(buffer == std::vector<float>(16, 0.0f));  // neither the forged nor the real message was delivered
  REQUIRE(sender.has_value());  // and rank 1 learns why from rank 0's abort
  CHECK_THAT(*sender, is_error(errc::peer_lost, {"rank 1: rank 0 failed: rank 0: frame from rank 1 belongs to another job"}));
}

// --- malformed frames -------------------------------------------------------------------

TEST_CASE("malformed frames from the wire fail the receive with protocol: bad magic, another protocol version, a "
          "corrupt header checksum",
          "[tcp][defences][frames]") {
  std::function<frame_edit(wire::header_bytes&)> edit;
  std::string expected;
  auto header_crc = std::make_shared<std::atomic<std::uint32_t>>(0);
  SECTION("bad magic") {
    edit = [](wire::header_bytes& b) {
      std::memcpy(b.data(), "HTTP", 4);  // what another program might send
      return frame_edit{};
    };
    expected = "rank 0: not a gradwire frame from rank 1 (magic 0x50545448, expected " + hex(wire::magic) +
               "): is another program talking to this port?";
  }
  SECTION("another protocol version") {
    const std::uint16_t version = wire::protocol_version + 1;
    edit = [version](wire::header_bytes& b) {
      wire::detail::put<std::uint16_t>(b.data() + 4, version);
      wire::detail::put<std::uint32_t>(b.data() + 44, wire::crc32c(std::span<const std::byte>(b.data(), 44)));  // resealed
      return frame_edit{};
    };
    expected = "rank 0: frame from rank 1 speaks gradwire protocol version " + std::to_string(version) +
               ", this build speaks " + std::to_string(wire::protocol_version) +
               ": run the same gradwire version on every rank";
  }
  SECTION("a corrupt header checksum") {
    edit = [header_crc](wire::header_bytes& b) {
      b[24] ^= std::byte{0x40};  // one bit of the tag; the header's CRC is left as it was
      header_crc->store(wire::detail::get<std::uint32_t>(b.data() + 44));
      return frame_edit{};
    };
    expected = "(filled in below)";
  }
  two_ranks job;
  std::vector<float> buffer(16, 0.0f);
  std::optional<gw::error> received;
  event posted;
  auto rank0 = [&](asio_tcp& t) {
    auto r = t.async_recv(1, 7, std::as_writable_bytes(std::span(buffer)));
    posted.raise();
    received = failure_of([&] { finish(t, r); });
  };
  auto rank1 = [&](asio_tcp& t) {
    posted.await("rank 0's receive");
    // Rank 1 fails too, one way or another (rank 0's abort or its closed connection).
    (void)failure_of([&] { send_and_await_answer(t, std::vector<float>(16, 2.5f)); });
  };
  job.run_through_proxy(on_first_data_frame(7, edit), rank0, rank1);
  if (expected == "(filled in below)")
    expected = "rank 0: corrupt frame header from rank 1 (header checksum " + hex(header_crc->load()) +
               " does not match its contents)";
  REQUIRE(job.proxy().altered_frames() == 1);
  REQUIRE(received.has_value());
  CHECK_THAT(*received, is_error(errc::protocol, {"from rank 1"}));
  CHECK(received->details() == expected);
  CHECK(buffer == std::vector<float>(16, 0.0f));
}

// --- a peer that finishes ---------------------------------------------------------------

TEST_CASE("a peer that finishes in good order fails a receive waiting on it with peer_lost saying it finished",
          "[tcp][defences][goodbye]") {
  two_ranks job;
  std::optional<gw::error> waited, later_receive, later_send;
  event posted;
  auto rank0 = [&](asio_tcp& t) {
    std::vector<float> buffer(16);
    auto r = t.async_recv(1, 5, std::as_writable_bytes(std::span(buffer)));
    posted.raise();  // rank 1 says goodbye now; rank 0 handles it only inside the wait below
    waited = failure_of([&] { finish(t, r); });
    // Afterwards nothing from rank 1 is waited for, and nothing is sent to it.
    later_receive = failure_of([&] {
      auto again = t.async_recv(1, 6, std::as_writable_bytes(std::span(buffer)));
      finish(t, again);
    });
    later_send = failure_of([&] {
      auto s = t.async_send(1, 6, std::as_bytes(std::span(buffer)));
      finish(t, s);
    });
  };
  auto rank1 = [&](asio_tcp&) {
    posted.await("rank 0's receive");
  };  // the transport goes here, in good order: a goodbye frame
  job.run(rank0, rank1);
  const std::string finished =
      "rank 0: rank 1 has finished (said goodbye) and will send nothing more";
  REQUIRE(waited.has_value());
  CHECK_THAT(*waited, is_error(errc::peer_lost, {finished}));
  CHECK(waited->details() == finished);
  REQUIRE(later_receive.has_value());
  CHECK(later_receive->kind() == errc::peer_lost);
  CHECK(later_receive->details() == finished);
  REQUIRE(later_send.has_value());
  CHECK(later_send->kind() == errc::peer_lost);
  CHECK(later_send->details() == finished);
}

// --- tags --------------------------------------------------------------------------------

TEST_CASE("asio_tcp refuses a tag at or above 2^48 - 1 with invalid_argument naming it, as UCX does, and delivers "
          "the largest tag below",
          "[tcp][defences][tag]") {
  two_ranks job;
  const std::uint64_t largest = (std::uint64_t{1} << 48) - 2;
  std::vector<std::optional<gw::error>> refused;
  std::vector<float> got(4, 0.0f);
  const std::vector<float> sent{1.5f, -2.0f, 3.25f, 4.0f};
  auto rank0 = [&](asio_tcp& t) {
    for (std::uint64_t tag : {largest + 1, std::uint64_t{1} << 48, ~std::uint64_t{0}}) {
      refused.push_back(failure_of([&] { t.async_recv(1, tag, std::as_writable_bytes(std::span(got))); }));
      refused.push_back(failure_of([&] { t.async_send(1, tag, std::as_bytes(std::span(sent))); }));
    }
    auto r = t.async_recv(1, largest, std::as_writable_bytes(std::span(got)));
    finish(t, r);
  };
  auto rank1 = [&](asio_tcp& t) {
    auto s = t.async_send(0, largest, std::as_bytes(std::span(sent)));
    finish(t, s);
  };
  job.run(rank0, rank1);
  REQUIRE(refused.size() == 6);
  const std::uint64_t tags[] = {largest + 1, std::uint64_t{1} << 48, ~std::uint64_t{0}};
  for (std::size_t i = 0; i < refused.size(); ++i) {
    CAPTURE(i);
    REQUIRE(refused[i].has_value());
    CHECK_THAT(*refused[i], is_error(errc::invalid_argument,
                                     {"asio_tcp: tag " + std::to_string(tags[i / 2]) + " is not below 2^48 - 1"}));
  }
  CHECK(got == sent);
}

// --- a peer's failure: its kind and its reason reach the other ranks -----------------------

TEST_CASE("a peer's config, timeout or mismatch error reaches a waiting rank with its kind, any other kind as a lost "
          "peer (every transport's rule)",
          "[tcp][defences][abort]") {
  for (const errc kind : {errc::config, errc::timeout, errc::mismatch, errc::invalid_argument, errc::protocol}) {
    CAPTURE(kind);
    two_ranks job;
    std::optional<gw::error> waited;
    event posted;
    auto rank0 = [&](asio_tcp& t) {
      posted.await("rank 1's receive");
      t.fail(kind, "the job's setting is bad");  // an abort frame to rank 1, ahead of the close
    };
    auto rank1 = [&](asio_tcp& t) {
      std::byte one{};
      auto r = t.async_recv(0, 5, {&one, 1});
      posted.raise();
      waited = failure_of([&] { finish(t, r); });
    };
    job.run(rank0, rank1);
    REQUIRE(waited.has_value());
    const errc heard = kind == errc::invalid_argument || kind == errc::protocol ? errc::peer_lost : kind;
    CHECK_THAT(*waited, is_error(heard, {"rank 1: rank 0 failed: the job's setting is bad"}));
  }
}

// Ranks 0, 1 and 2 of one job on three threads; rank r runs fns[r] on its transport (an
// asio_tcp, or a type derived from it that exposes its engine).
template <class Transport = asio_tcp>
void run_three_ranks(const std::function<void(Transport&)> (&fns)[3]) {
  const std::uint16_t port = free_port();
  std::exception_ptr errors[3];
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        asio_tcp_options o;
        o.rank = r;
        o.size = 3;
        o.job_token = job_token;
        o.store_port = port;
        o.connect_timeout = patience;
        Transport t(o);
        fns[r](t);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST_CASE("a rank that fails on a peer's abort relays the reason before its connections close, so a third rank "
          "that abort never reached still reports the root cause",
          "[tcp][defences][abort]") {
  // Rank 0's abort goes out only on idle links, and its link to rank 2 is busy: a 64 MiB
  // send rank 2 does not read (it stays outside gradwire until rank 1 has failed). So only
  // rank 1 hears rank 0's reason; rank 2 learns it from rank 1, whose connection to it
  // closes right after (without the relay: "lost rank 1: its connection closed").
  std::optional<gw::error> at1, at2;
  event sending, rank1_failed;
  const std::vector<std::byte> big(std::size_t{64} << 20);
  const std::function<void(asio_tcp&)> fns[3] = {
      [&](asio_tcp& t) {
        auto s = t.async_send(2, 9, big);
        sending.raise();
        t.fail(errc::config, "parameter_server: the job's setting is bad");
      },
      [&](asio_tcp& t) {
        std::byte one{};
        auto r = t.async_recv(0, 5, {&one, 1});
        sending.await("rank 0's send to rank 2");
        at1 = failure_of([&] { finish(t, r); });
        rank1_failed.raise();
      },
      [&](asio_tcp& t) {
        rank1_failed.await("rank 1's failure");
        std::byte one{};
        auto r = t.async_recv(1, 5, {&one, 1});
        at2 = failure_of([&] { finish(t, r); });
      }};
  run_three_ranks(fns);
  REQUIRE(at1.has_value());
  CHECK_THAT(*at1, is_error(errc::config, {"rank 1: rank 0 failed: parameter_server: the job's setting is bad"}));
  REQUIRE(at2.has_value());
  CHECK_THAT(*at2, is_error(errc::config, {"rank 2: rank 1 failed: rank 1: rank 0 failed: parameter_server: the job's "
                                           "setting is bad"}));
}

// asio_tcp with its engine in reach: a test breaks one connection by hand.
struct exposed_tcp : asio_tcp {
  using asio_tcp::asio_tcp;
  gw::transport::detail::tcp_engine& engine() { return *engine_; }
};

TEST_CASE("a rank that fails from a lost peer says which, so a rank that has not noticed the loss reports it, not the "
          "closed connections of the rank that did",
          "[tcp][defences][abort]") {
  // Rank 1 closes its connection to rank 0 only (what shared memory shows of a killed
  // process: one peer notices at once, another only at its next keepalive). Rank 0 fails
  // from the loss after its grace and closes its connections; rank 2, whose link to rank 1
  // is still up, would otherwise report "lost rank 0".
  std::optional<gw::error> at0, at2;
  event posted0, posted2, done;
  const std::function<void(exposed_tcp&)> fns[3] = {
      [&](exposed_tcp& t) {
        std::byte one{};
        auto r = t.async_recv(1, 5, {&one, 1});
        posted0.raise();
        at0 = failure_of([&] { finish(t, r); });
      },
      [&](exposed_tcp& t) {
        t.tolerate_loss(0);  // rank 1 itself goes on past its end of the cut: only rank 0 reports it
        posted0.await("rank 0's receive");
        posted2.await("rank 2's receive");
        boost::system::error_code ignored;
        t.engine().links[0]->socket.shutdown(gw::support::tcp::socket::shutdown_both, ignored);
        done.await("rank 2's failure");
      },
      [&](exposed_tcp& t) {
        std::byte one{};
        auto r = t.async_recv(0, 5, {&one, 1});
        posted2.raise();
        at2 = failure_of([&] { finish(t, r); });
        done.raise();
      }};
  run_three_ranks(fns);
  const std::string why = "its connection closed (the process exited or was killed)";
  REQUIRE(at0.has_value());
  CHECK_THAT(*at0, is_error(errc::peer_lost, {"rank 0: lost rank 1: " + why}));
  REQUIRE(at2.has_value());
  CHECK_THAT(*at2, is_error(errc::peer_lost, {"rank 2: lost rank 1: rank 0 reports: " + why}));
}

// --- stall reports: the chain of waits, every link of it --------------------------------

namespace {

namespace tcpd = gradwire::transport::detail;

// Options for an engine whose stall report is read by hand: no heartbeats, so a stalled
// peer's liveness does not depend on a socket (an unopened one here).
asio_tcp_options unjoined_options(int rank, int size) {
  asio_tcp_options o;
  o.rank = rank;
  o.size = size;
  o.heartbeat_interval = 0s;
  return o;
}

// An engine that joined nobody (stall_report reads only its links, the latest status
// frame each peer sent, and whom this rank waits for): a link to each of `peers`.
std::unique_ptr<tcpd::tcp_engine> unjoined_engine(int rank, int size, std::initializer_list<int> peers) {
  auto e = std::make_unique<tcpd::tcp_engine>(unjoined_options(rank, size));
  for (int p : peers)
    e->links[static_cast<std::size_t>(p)] = std::make_unique<tcpd::tcp_link>(gw::support::tcp::socket(e->io), p);
  return e;
}

// What `peer` said in its latest status frame: whom it waits for, in what.
void said(tcpd::tcp_engine& e, int peer, std::vector<int> waits_for, std::uint64_t operation = 0,
          std::string activity = {}) {
  e.links[static_cast<std::size_t>(peer)]->status =
      tcpd::peer_status{std::move(waits_for), operation, 40, std::move(activity)};
}

// The calling thread is in `name`'s operation #`operation` of training step `step` for
// the scope's life (what a report's first link names).
class doing {
 public:
  doing(const char* name, std::uint64_t operation, std::uint64_t step)
      : saved_(gw::observe::current_activity()), saved_step_(gw::observe::current_step().load()) {
    gw::observe::current_activity() = {name, operation};
    gw::observe::current_step().store(step);
  }
  ~doing() {
    gw::observe::current_activity() = saved_;
    gw::observe::current_step().store(saved_step_);
  }

 private:
  gw::observe::activity saved_;
  std::uint64_t saved_step_;
};

const std::string not_calling = "it is connected but not calling gradwire (stopped, hung or in a long computation)";

// What rank e reports after waiting `waited`, and the ranks it names as stalled.
struct stall_seen {
  std::string report;
  std::vector<int> stalled;
};
stall_seen report_of(tcpd::tcp_engine& e, std::chrono::milliseconds waited) {
  stall_seen seen;
  seen.report = e.stall_report(waited, seen.stalled);
  return seen;
}

}  // namespace

TEST_CASE("a stall report names, at every link of the chain of waits, the rank that waits and the rank it waits for",
          "[tcp][stall]") {
  // Rank 2 waits for 5, 5 for 0, 0 for 4, 4 for 1, and rank 1 has said nothing. No link
  // joins ranks adjacent in number, so a link that named a neighbour of the right rank,
  // the rank before it in the chain or the one after shows; rank 3 also waits for rank 1,
  // but nobody in the chain waits for rank 3.
  auto e = unjoined_engine(2, 6, {0, 1, 3, 4, 5});
  said(*e, 5, {0}, 12, "all_reduce");
  said(*e, 0, {4}, 13, "broadcast");
  said(*e, 4, {1});  // a wait outside any collective: no activity to name
  said(*e, 3, {1}, 12, "all_reduce");
  e->waiting_for = {5};
  const doing in("all_reduce", 12, 40);
  const auto [report, stalled] = report_of(*e, 61500ms);
  CHECK(report ==
        "rank 2: waited 61.5 s in all_reduce (operation #12, step 40) for rank 5; "
        "rank 5 waits for rank 0 (in all_reduce, operation #12); "
        "rank 0 waits for rank 4 (in broadcast, operation #13); "
        "rank 4 waits for rank 1; "
        "rank 1 has said nothing: " + not_calling);
  CHECK(stalled == std::vector<int>{1});
}

TEST_CASE("a stall report follows every branch of the waits, each rank once, to every rank that said nothing, or "
          "says the waits form a cycle",
          "[tcp][stall]") {
  SECTION("branches") {
    // Rank 2 waits for 5 and 3; 5 for 0; 3 for 0 (followed once) and 6, whose connection
    // is gone; 0 for 4; 4 for 1 and for rank 2 itself; rank 1 no longer waits.
    auto e = unjoined_engine(2, 7, {0, 1, 3, 4, 5});
    said(*e, 5, {0});
    said(*e, 3, {0, 6});
    said(*e, 0, {4});
    said(*e, 4, {1, 2});
    said(*e, 1, {});
    e->waiting_for = {5, 3};
    const doing in(nullptr, 0, 0);
    const auto [report, stalled] = report_of(*e, 2000ms);
    CHECK(report ==
          "rank 2: waited 2.0 s in a transport wait (operation #0, step 0) for ranks 5, 3; "
          "rank 5 waits for rank 0; rank 3 waits for ranks 0, 6; rank 0 waits for rank 4; rank 4 waits for ranks 1, 2; "
          "rank 6 has said nothing: its connection is gone; rank 1 has said nothing: " + not_calling);
    CHECK(stalled == std::vector<int>{6, 1});
  }
  SECTION("a cycle") {
    // Rank 0 waits for 3, 3 for 1, 1 for 2, 2 for 0: nobody stalled, the ranks wait in a ring.
    auto e = unjoined_engine(0, 4, {1, 2, 3});
    said(*e, 3, {1});
    said(*e, 1, {2});
    said(*e, 2, {0});
    e->waiting_for = {3};
    const doing in(nullptr, 0, 0);
    const auto [report, stalled] = report_of(*e, 2000ms);
    CHECK(report ==
          "rank 0: waited 2.0 s in a transport wait (operation #0, step 0) for rank 3; "
          "rank 3 waits for rank 1; rank 1 waits for rank 2; rank 2 waits for rank 0; "
          "the ranks wait for each other in a cycle (do all ranks call the same collectives in the same order?)");
    CHECK(stalled.empty());
  }
}

namespace {
// Ranks 0..n-1 of one job on their own threads: rank r runs fns[r] on its transport,
// joined with the options `adjust` gives it.
void run_ranks(const std::vector<std::function<void(asio_tcp&)>>& fns,
               const std::function<void(int, asio_tcp_options&)>& adjust) {
  const std::uint16_t port = free_port();
  const int n = static_cast<int>(fns.size());
  std::vector<std::exception_ptr> errors(fns.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        asio_tcp_options o;
        o.rank = r;
        o.size = n;
        o.job_token = job_token;
        o.store_port = port;
        o.connect_timeout = patience;
        adjust(r, o);
        asio_tcp t(o);
        fns[static_cast<std::size_t>(r)](t);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}
}  // namespace

namespace {
// A status frame's payload as send_status writes it: step, count, the ranks, the activity.
std::vector<std::byte> status_payload(std::uint64_t step, std::vector<std::uint32_t> waits_for, std::string_view activity) {
  std::vector<std::byte> bytes(12 + 4 * waits_for.size() + activity.size());
  gw::support::wire::detail::put<std::uint64_t>(bytes.data(), step);
  gw::support::wire::detail::put<std::uint32_t>(bytes.data() + 8, static_cast<std::uint32_t>(waits_for.size()));
  for (std::size_t i = 0; i < waits_for.size(); ++i)
    gw::support::wire::detail::put<std::uint32_t>(bytes.data() + 12 + 4 * i, waits_for[i]);
  std::memcpy(bytes.data() + 12 + 4 * waits_for.size(), activity.data(), activity.size());
  return bytes;
}
}  // namespace

TEST_CASE("asio_tcp's options: each bound is accepted at its edge and refused one step past it, with a config error "
          "naming the bounds",
          "[tcp][options]") {
  struct edge {
    const char* name;
    std::function<void(asio_tcp_options&)> at, past;
  };
  const std::vector<edge> edges{
      {"heartbeat_interval", [](auto& o) { o.heartbeat_interval = 0s; }, [](auto& o) { o.heartbeat_interval = -1s; }},
      {"heartbeat_misses", [](auto& o) { o.heartbeat_misses = 1; }, [](auto& o) { o.heartbeat_misses = 0; }},
      {"stall_warn", [](auto& o) { o.stall_warn = 1ms; }, [](auto& o) { o.stall_warn = 0ms; }},
      {"stall_timeout", [](auto& o) { o.stall_timeout = 0ms; }, [](auto& o) { o.stall_timeout = -1ms; }},
      {"chunk_bytes", [](auto& o) { o.chunk_bytes = 16; }, [](auto& o) { o.chunk_bytes = 8; }},
      {"chunk_bytes", [](auto& o) { o.chunk_bytes = 16; }, [](auto& o) { o.chunk_bytes = 0; }},
      {"early_bytes", [](auto& o) { o.early_bytes = 0; }, [](auto& o) { o.early_bytes = 8; }},
  };
  for (const auto& e : edges) {
    CAPTURE(e.name);
    auto at = unjoined_options(0, 2);
    e.at(at);
    CHECK_NOTHROW(tcpd::tcp_engine(at));
    auto past = unjoined_options(0, 2);
    e.past(past);
    const auto failure = failure_of([&] { tcpd::tcp_engine refused(past); });
    REQUIRE(failure.has_value());
    CHECK(failure->kind() == errc::config);
    CHECK_THAT(failure->what(), Catch::Contains(e.name));
  }
  // A rank outside the job, and a job of no rank: named with the range they miss.
  for (const auto& [rank, size, says] : {std::tuple{2, 2, "asio_tcp: rank 2 is outside 0..1 (world size 2)"},
                                         std::tuple{-1, 3, "asio_tcp: rank -1 is outside 0..2 (world size 3)"},
                                         std::tuple{0, 0, "asio_tcp: world size must be >= 1, got 0"}}) {
    CAPTURE(rank, size);
    const auto failure = failure_of([&] { tcpd::tcp_engine refused(unjoined_options(rank, size)); });
    REQUIRE(failure.has_value());
    CHECK(failure->kind() == errc::config);
    CHECK_THAT(failure->what(), Catch::Contains(says));
  }
}

TEST_CASE("a status frame naming a rank outside the job is refused as malformed, failing the rank with protocol",
          "[tcp][stall]") {
  // What a stall report follows comes from peers' frames: a rank number past the job (a
  // corrupt frame that kept the job's token) must not index the report's table of ranks.
  {
    auto e = unjoined_engine(2, 6, {0, 1, 3, 4, 5});
    REQUIRE(e->on_status(*e->links[5], status_payload(40, {0, 4, 2}, "all_reduce")));  // every rank of the job
    REQUIRE(e->links[5]->status.has_value());
    CHECK(e->links[5]->status->waits_for == std::vector<int>{0, 4, 2});
    CHECK(e->links[5]->status->activity == "all_reduce");
    CHECK_FALSE(e->failed.has_value());
  }
  for (const std::uint32_t outside : {6u, 7u, 0x80000000u, 0xffffffffu}) {
    CAPTURE(outside);
    auto e = unjoined_engine(2, 6, {0, 1, 3, 4, 5});
    REQUIRE_FALSE(e->on_status(*e->links[5], status_payload(40, {0, outside}, "all_reduce")));
    CHECK_FALSE(e->links[5]->status.has_value());
    REQUIRE(e->failed.has_value());
    CHECK(e->failed->first == errc::protocol);
    CHECK_THAT(e->failed->second, Catch::Contains("rank 5 sent a malformed status frame"));
  }
}

TEST_CASE("a replacement process whose peers never answer its hello is not linked to them: an operation with one "
          "fails with peer_lost saying so",
          "[tcp][rejoin]") {
  // A job of 3 ranks; ranks 0 and 2 stay outside gradwire (as if stopped), so nobody answers
  // the hello of rank 1's replacement (GRADWIRE_REJOIN=1), which dials both. Its join gives
  // up on them at its deadline and goes on without them: a send to either is a clear
  // peer_lost naming the unanswered hello, never a link nobody made.
  event joined0, joined2, replaced;
  std::optional<gw::error> to0, to2;
  const std::vector<std::byte> word(4);
  const std::uint16_t port = free_port();
  auto stopped = [&](event& joined) {
    return [&](asio_tcp&) {
      joined.raise();  // its join is over: a hello now waits for it in vain
      replaced.await("the replacement's sends");
    };
  };
  run_ranks({stopped(joined0),
             [&](asio_tcp&) {
               joined0.await("rank 0's join");
               joined2.await("rank 2's join");
               asio_tcp_options o;
               o.rank = 1;
               o.size = 3;
               o.job_token = job_token;
               o.store_port = port;
               o.rejoin = true;
               o.connect_timeout = 1500ms;  // the hello's wait ends here, well inside `patience`
               try {
                 asio_tcp replacement(o);
                 to0 = failure_of([&] { auto s = replacement.async_send(0, 5, word); finish(replacement, s); });
                 to2 = failure_of([&] { auto s = replacement.async_send(2, 5, word); finish(replacement, s); });
               } catch (...) {
                 replaced.raise();
                 throw;
               }
               replaced.raise();
             },
             stopped(joined2)},
            [&](int, asio_tcp_options& o) { o.store_port = port; });
  for (auto [peer, failure] : {std::pair{0, &to0}, std::pair{2, &to2}}) {
    CAPTURE(peer);
    REQUIRE(failure->has_value());
    CHECK_THAT(**failure, is_error(errc::peer_lost, {"rank 1 (a replacement process, GRADWIRE_REJOIN=1) is not linked "
                                                     "to rank " + std::to_string(peer) +
                                                     ": it did not answer the hello in time"}));
  }
}

TEST_CASE("an early_bytes below the 64 KiB frame buffer still gets a link's early buffer of 64 KiB: large messages "
          "arrive whole, parked or not",
          "[tcp][receive]") {
  // A frame too large for the frame buffer leaves what one read took of it in the early
  // buffer, whatever early_bytes says (0: no read-ahead): so that buffer is never smaller
  // than the frame buffer. Rank 1 sends 300 KiB + 12 bytes (past eager_bytes) on tag 7, a
  // word on tag 9, and the 300 KiB again on tag 8. Rank 0 waits for tag 9 first: the tag-7
  // message parks (its head read ahead) and that wait takes it into memory; the tag-8
  // receive is posted before its message comes.
  for (const std::size_t early : {std::size_t{0}, std::size_t{16}, std::size_t{1} << 20}) {
    CAPTURE(early);
    std::vector<float> sent(300 * 1024 / 4 + 3);
    for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<float>(i % 100003) + 0.25f;
    std::vector<float> parked(sent.size()), posted(sent.size());
    float word = 0;
    event receive_posted;
    run_ranks({[&](asio_tcp& t) {
                 auto w = t.async_recv(1, 9, std::as_writable_bytes(std::span(&word, 1)));
                 finish(t, w);
                 auto p = t.async_recv(1, 8, std::as_writable_bytes(std::span(posted)));
                 receive_posted.raise();
                 auto r = t.async_recv(1, 7, std::as_writable_bytes(std::span(parked)));
                 finish(t, r);
                 finish(t, p);
               },
               [&](asio_tcp& t) {
                 const float one = 1;
                 auto s7 = t.async_send(0, 7, std::as_bytes(std::span(sent)));
                 auto s9 = t.async_send(0, 9, std::as_bytes(std::span(&one, 1)));
                 finish(t, s7);
                 finish(t, s9);
                 receive_posted.await("rank 0's tag-8 receive");
                 auto s8 = t.async_send(0, 8, std::as_bytes(std::span(sent)));
                 finish(t, s8);
               }},
              [&](int, asio_tcp_options& o) { o.early_bytes = early; });
    CHECK(word == 1);
    CHECK(parked == sent);
    CHECK(posted == sent);
  }
}

TEST_CASE("an operation withdrawn mid-message is let finish, so that the link stays in step: a receive dropped "
          "while its frame arrives, a send dropped while it is written",
          "[tcp][cancel]") {
  // A collective that every rank of an elastic view abandons at once (a member was lost)
  // drops its requests with frames half through the connection between two survivors;
  // cutting the stream there would lose the survivors to each other. The side that drops
  // its request first waits 1 ms for it: a send is under way from its post (the kernel took
  // part of it), a receive once that wait has read the frame's header (it is in the socket:
  // the other side said so), and 64 MiB take far longer than 1 ms.
  std::vector<float> big(16 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 65521) + 0.5f;
  std::vector<float> landed(big.size()), taken(big.size());
  float word = 0, answer = 0;
  event first_sent, second_posted;
  auto let_it_start = [](asio_tcp& t, asio_tcp::request& r) {
    try {
      t.wait_any(std::span<asio_tcp::request* const>(std::array{&r}), gw::clock::now() + 1ms);
      FAIL("64 MiB went through in 1 ms: the frame was never withdrawn mid-message");
    } catch (const gw::error& e) {
      REQUIRE(e.kind() == gw::errc::timeout);
    }
  };
  run_ranks({[&](asio_tcp& t) {
               // A receive dropped mid-frame, then the next message on the same link.
               first_sent.await("rank 1's first send");
               {
                 auto r = t.async_recv(1, 1, std::as_writable_bytes(std::span(landed)));
                 let_it_start(t, r);
               }
               auto w = t.async_recv(1, 2, std::as_writable_bytes(std::span(&word, 1)));
               finish(t, w);
               // The other side drops its send mid-frame: this receive still gets all of it.
               auto r3 = t.async_recv(1, 3, std::as_writable_bytes(std::span(taken)));
               second_posted.raise();
               finish(t, r3);
               const float reply = word + 1;
               auto s = t.async_send(1, 4, std::as_bytes(std::span(&reply, 1)));
               finish(t, s);
             },
             [&](asio_tcp& t) {
               auto s1 = t.async_send(0, 1, std::as_bytes(std::span(big)));
               first_sent.raise();
               const float forty_two = 42;
               auto s2 = t.async_send(0, 2, std::as_bytes(std::span(&forty_two, 1)));
               finish(t, s1);
               finish(t, s2);
               second_posted.await("rank 0's tag-3 receive");
               {
                 auto s3 = t.async_send(0, 3, std::as_bytes(std::span(big)));
                 let_it_start(t, s3);
               }
               auto a = t.async_recv(0, 4, std::as_writable_bytes(std::span(&answer, 1)));
               finish(t, a);
               CHECK(t.lost_peers().empty());
             }},
            [](int, asio_tcp_options&) {});
  CHECK(word == 42);
  CHECK(taken == big);
  CHECK(answer == 43);
}

// --- before a wait sleeps: the hot-poll window and parked messages ----------------------

TEST_CASE("a hot-poll window that the answer missed closes the spin gate, and one it came in opens it again", "[tcp][wait]") {
  // With a CPU per rank a wait polls hot for poll_before_sleep first, while the spin gate
  // says that pays (support/waiting.hpp): the window's outcome is what the gate learns.
  auto e = unjoined_engine(0, 2, {1});
  e->dedicated = true;
  e->options.poll_before_sleep = 2ms;
  tcpd::tcp_op missed;
  missed.peer = 1;
  e->poll_briefly(missed);  // nothing arrives: the window runs out
  CHECK(missed.state == tcpd::op_status::queued);
  CHECK(e->spin.misses_in_a_row() == 1);
  tcpd::tcp_op answered;
  answered.peer = 1;
  e->poll_briefly(answered);  // the closed gate skips this wait's window: nothing is learnt
  CHECK(e->spin.misses_in_a_row() == 1);
  boost::asio::post(e->io, [&] { answered.state = tcpd::op_status::done; });  // the answer, inside the window
  e->poll_briefly(answered);
  CHECK(answered.state == tcpd::op_status::done);
  CHECK(e->spin.misses_in_a_row() == 0);
}

TEST_CASE("only a wait for another receive of that peer takes its parked message into memory, never a send's wait",
          "[tcp][wait]") {
  // A large message from rank 1 (tag 9) waits, parked, for its receive. A wait for a
  // receive of another tag from rank 1 would wait behind it forever, so it takes the parked
  // one into memory (here: marks the read-ahead in flight to do so when it lands). A send's
  // wait, or a wait for the parked message's own receive, must leave it to go straight into
  // place: taking it would cost a copy for nothing.
  struct waiting_op {
    bool is_send;
    std::uint64_t tag;
    bool evicts;
  };
  for (const auto [is_send, tag, evicts] : {waiting_op{true, 5, false}, waiting_op{true, 9, false},
                                            waiting_op{false, 9, false}, waiting_op{false, 5, true}}) {
    CAPTURE(is_send, tag);
    auto e = unjoined_engine(0, 2, {1});
    e->options.poll_before_sleep = 0ms;
    auto& link = *e->links[1];
    link.parked = true;
    link.early_reading = true;
    link.incoming.tag = 9;
    tcpd::tcp_op op;
    op.is_send = is_send;
    op.peer = 1;
    op.tag = tag;
    { const auto wait = e->prepare_wait(op); }
    CHECK(link.evict == evicts);
    CHECK(link.parked);
  }
}

TEST_CASE("a link lost while the rank flushes its abort counts as dead at once: the flush does not wait for its write",
          "[tcp][wait]") {
  // abort_all lets writes in flight finish (up to 200 ms) so that the abort frame can follow
  // them, and meanwhile closes nothing. A peer's bad frame read then loses that link: it
  // must stop counting as a live link with a write in flight (the flush waits for those),
  // though failing everything waits for the abort itself.
  auto e = unjoined_engine(0, 3, {1, 2});
  auto& link = *e->links[1];
  link.writing = true;
  e->aborting = true;
  e->lose(link, errc::protocol, "rank 1 sent a malformed status frame");
  CHECK_FALSE(link.alive);
  CHECK(e->links[2]->alive);
  CHECK_FALSE(e->failed.has_value());  // failing the rank is abort_all's, after the flush
  e->aborting = false;
}

TEST_CASE("a waiting rank tells its peers what it waits for only near its stall warning: a shorter wait says nothing",
          "[tcp][stall]") {
  // Rank 1 waits for rank 2 with a 10 s warning (it would tell at 7.5 s); rank 0 waits for
  // rank 1, begins after rank 1 began, and gives up 1 s into it. Rank 1 has told nothing yet,
  // so rank 0 names it as the rank that said nothing; a rank that told its waits at once
  // would put a status frame on the wire at every wait, however short.
  constexpr int n = 3;
  std::optional<gw::error> failed[n];
  event waiting(30s);  // rank 1 has posted its receive and is about to wait
  event ended[n] = {event(30s), event(30s), event(30s)};
  std::vector<std::function<void(asio_tcp&)>> fns;
  for (int r = 0; r < n; ++r)
    fns.push_back([&, r](asio_tcp& t) {
      if (r == 2) {  // outside gradwire until both waits have ended
        for (int q : {0, 1}) ended[q].await("rank " + std::to_string(q) + "'s wait to end");
        return;
      }
      struct raise_on_exit {
        event& e;
        ~raise_on_exit() { e.raise(); }
      } const end{ended[r]};
      if (r == 0) waiting.await("rank 1's wait");
      std::byte one{};
      auto recv = t.async_recv(r + 1, 5, {&one, 1});
      if (r == 1) waiting.raise();
      failed[r] = failure_of([&] { t.wait(recv, gw::clock::now() + 20s); });
    });
  run_ranks(fns, [](int r, asio_tcp_options& o) {
    o.heartbeat_interval = 0s;
    o.stall_warn = r == 0 ? 1000ms : 10000ms;
    o.stall_timeout = r == 0 ? 1000ms : 0ms;
  });
  REQUIRE(failed[0].has_value());
  CHECK_THAT(*failed[0], is_error(errc::timeout, {"rank 1 stalled (gave up after GRADWIRE_STALL_TIMEOUT=1 s): rank 0: "
                                                  "waited ", " for rank 1; rank 1 has said nothing: " + not_calling}));
}

TEST_CASE("a stall timeout names every link of the chain of waits that the waiting ranks told in their status frames",
          "[tcp][stall]") {
  // Five ranks on real sockets: rank 0 waits for 3, 3 for 1, 1 for 4, 4 for 2, and rank 2
  // stays outside gradwire until rank 0 has given up. Ranks 3, 1 and 4 say what they wait
  // for at 3/4 of their 0.5 s stall warning; rank 0 begins its wait only after they began
  // theirs, and gives up 5 s into it, naming the chain as their status frames told it (over
  // 4 s for a frame sent at 0.375 s to arrive: room for a loaded machine and the sanitizers).
  constexpr int n = 5;
  const int waits_for[n] = {3, 4, -1, 1, 2};  // whom each rank receives from; -1: nobody (rank 2)
  std::optional<gw::error> failed[n];
  event waiting[n];  // rank r has posted its receive and is about to wait
  // Rank r's wait has ended. Rank 2 leaves (its goodbye fails a wait for it) only after
  // every wait has: each ends on rank 0's reason, not on rank 2's departure.
  event ended[n] = {event(30s), event(30s), event(30s), event(30s), event(30s)};
  std::vector<std::function<void(asio_tcp&)>> fns;
  for (int r = 0; r < n; ++r)
    fns.push_back([&, r](asio_tcp& t) {
      if (r == 2) {
        for (int q : {0, 3, 1, 4}) ended[q].await("rank " + std::to_string(q) + "'s wait to end");
        return;
      }
      struct raise_on_exit {
        event& e;
        ~raise_on_exit() { e.raise(); }
      } const end{ended[r]};  // also when this rank fails otherwise: rank 2 then leaves at once
      if (r == 0)
        for (int q : {3, 1, 4}) waiting[q].await("rank " + std::to_string(q) + "'s wait");
      std::byte one{};
      auto recv = t.async_recv(waits_for[r], 5, {&one, 1});
      waiting[r].raise();
      failed[r] = failure_of([&] { t.wait(recv, gw::clock::now() + 20s); });
    });
  run_ranks(fns, [](int r, asio_tcp_options& o) {
    o.heartbeat_interval = 0s;  // rank 2 is named as connected, not by its host's answers
    o.stall_warn = r == 0 ? 5000ms : 500ms;
    o.stall_timeout = r == 0 ? 5000ms : 0ms;
  });
  REQUIRE(failed[0].has_value());
  CHECK_THAT(*failed[0], is_error(errc::timeout,
                                  {"rank 2 stalled (gave up after GRADWIRE_STALL_TIMEOUT=5 s): rank 0: waited ",
                                   " for rank 3; rank 3 waits for rank 1; rank 1 waits for rank 4; "
                                   "rank 4 waits for rank 2; rank 2 has said nothing: " + not_calling}));
  for (int r : {3, 1, 4}) {
    CAPTURE(r);
    REQUIRE(failed[r].has_value());  // rank 0's abort ends their waits with its reason
    CHECK_THAT(*failed[r], is_error(errc::timeout, {"rank 0 failed: rank 2 stalled"}));
  }
}
