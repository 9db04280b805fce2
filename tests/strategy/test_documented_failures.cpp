// Documented failures (docs/errors.md) provoked for real: a replica that throws, a parameter-server protocol violation, a message of the wrong size over TCP
// (the rendezvous store's refusals and timeouts, in this executable too: tests/rendezvous/test_store.cpp).
//
// Every case stages its situation with explicit synchronisation (atomics and events the
// test owns, transports that count what the strategy posts), never with a sleep, and
// every wait is bounded by `patience`: a defence that is missing fails its case within
// seconds instead of hanging. Each case asserts the errc and the words of the documented
// message that name the rank, the operation and the sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <gradwire/gradwire.hpp>
#include <gradwire/ps/protocol.hpp>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "helpers/errors.hpp"
#include "helpers/event.hpp"

#if defined(GRADWIRE_HAS_ASIO)  // the TCP case
#include <gradwire/support/asio.hpp>
#include <gradwire/transport/asio_tcp.hpp>
#endif

namespace gw = gradwire;
using gw::errc;
using namespace std::chrono_literals;

namespace {

// Every wait in this file: each hand-over between threads, each receive, each deadline given to gradwire.
constexpr std::chrono::milliseconds patience = 5s;

using gradwire::testing::outcome;
using gradwire::testing::outcome_of;

// Polls `done` until it holds or `patience` has passed (a bounded poll of a condition the
// test owns: nothing is created by the waiting itself).
template <class Pred>
void await(Pred done, const std::string& what) {
  const auto until = std::chrono::steady_clock::now() + patience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("timed out waiting for " + what);
    std::this_thread::sleep_for(1ms);
  }
}

using gradwire::testing::event;  // ordered without sleeping, within 5 s

// --- a replica that throws ------------------------------------------------------------

// inproc that counts, once its rank is armed, the receives the strategy has posted and the
// sends it posted after its first receive (atomics: any thread may read them), so that
// another rank can wait until this one is inside a step, waiting.
struct counting_inproc : gw::transport::inproc {
  struct counters {
    std::atomic<bool> armed{false};
    std::atomic<int> receives{0};
    std::atomic<int> sends_after_receive{0};
  };
  counting_inproc(gw::transport::inproc t, counters& c) : inproc(std::move(t)), c_(&c) {}
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    auto r = inproc::async_send(peer, tag, bytes);
    if (c_->armed.load() && c_->receives.load() > 0) c_->sends_after_receive.fetch_add(1);
    return r;
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    auto r = inproc::async_recv(peer, tag, bytes);
    count();
    return r;
  }
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    auto r = inproc::async_recv_accumulate(peer, tag, inout);
    count();
    return r;
  }
  void count() {
    if (c_->armed.load()) c_->receives.fetch_add(1);
  }
  counters* c_;
};
static_assert(gw::concepts::transport<counting_inproc> && gw::concepts::failable_transport<counting_inproc>);

const std::vector<std::size_t> model_sizes{6, 3};

std::vector<gw::host_tensor<float>> model_params(int rank) {
  std::vector<gw::host_tensor<float>> p;
  for (std::size_t n : model_sizes) {
    p.emplace_back(gw::shape{n});
    for (std::size_t i = 0; i < n; ++i) p.back()[i] = 0.25f * float(i) - float(rank);
  }
  return p;
}
std::vector<std::vector<float>> model_gradients(int rank, int step) {
  std::vector<std::vector<float>> g;
  for (std::size_t n : model_sizes) {
    g.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) g.back()[i] = 0.01f * float(i + 1) * float(rank + 1) + 0.001f * float(step);
  }
  return g;
}

struct replica_failure {
  std::vector<outcome> ranks;  // what each rank's replica threw
  outcome rethrown;            // what run_inproc rethrew
  std::vector<int> receives;   // receives each rank posted in the failing step
};

// `ranks` replicas of Strategy (its aggregation built by make_aggregation) take `fail_at`
// good steps; then every replica but `failing` enters step `fail_at`, and `failing`, once
// each of the others has posted a receive in that step, steps with one gradient tensor
// for two parameter tensors (strategy::step's invalid_argument: its own error).
template <class Strategy, class MakeAggregation>
replica_failure fail_one_replica(int ranks, int failing, int fail_at, MakeAggregation make_aggregation) {
  replica_failure out;
  out.ranks.resize(static_cast<std::size_t>(ranks));
  std::vector<counting_inproc::counters> counters(static_cast<std::size_t>(ranks));
  out.rethrown = outcome_of([&] {
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      const int me = t.rank();
      auto& mine = counters[static_cast<std::size_t>(me)];
      try {
        Strategy s(counting_inproc(t, mine), model_params(me), gw::optim::sgd({.lr = 0.1}), make_aggregation(),
                   {.timeout = 2 * patience});
        for (int k = 0; k < fail_at; ++k) s.step(model_gradients(me, k));
        if (me != failing) {
          mine.armed = true;
          s.step(model_gradients(me, fail_at));
          throw std::runtime_error("rank " + std::to_string(me) + " finished the step its peer failed in");
        }
        await(
            [&] {
              for (int r = 0; r < ranks; ++r)
                if (r != failing && counters[static_cast<std::size_t>(r)].receives.load() == 0) return false;
              return true;
            },
            "every other replica to post a receive in step " + std::to_string(fail_at));
        std::vector<std::vector<float>> one_short{model_gradients(me, fail_at)[0]};
        s.step(one_short);
      } catch (const gw::error& e) {
        out.ranks[static_cast<std::size_t>(me)] = {e.kind(), e.what()};
        throw;
      }
    });
  });
  for (auto& c : counters) out.receives.push_back(c.receives.load());
  return out;
}

void check_replica_failure(const replica_failure& f, int failing) {
  const std::string own = "strategy::step: got 1 gradient tensors for 2 parameter tensors";
  const std::string named = "rank " + std::to_string(failing) + " failed: " + own;
  const int ranks = static_cast<int>(f.ranks.size());
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, f.ranks[r].what, f.receives[r]);
    if (r == failing) {
      REQUIRE(f.ranks[r].kind == errc::invalid_argument);
      REQUIRE_THAT(f.ranks[r].what, Catch::StartsWith(own));
    } else {
      REQUIRE(f.receives[r] > 0);  // it was inside the step (the staging held)
      REQUIRE(f.ranks[r].kind == errc::peer_lost);
      REQUIRE_THAT(f.ranks[r].what, Catch::StartsWith("rank " + std::to_string(r) + ": ") && Catch::Contains(named) &&
                                        Catch::EndsWith("peer lost"));
    }
  }
  // run_inproc rethrows the failing replica's own error, not a lower rank's peer_lost echo.
  CAPTURE(f.rethrown.what);
  REQUIRE(f.rethrown.kind == errc::invalid_argument);
  REQUIRE(f.rethrown.what == f.ranks[failing].what);
}

TEST_CASE("central_storage: a replica that throws inside a step fails the others with peer_lost naming it, and run_inproc rethrows its own error") {
  using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::central, counting_inproc>;
  // Owner 0; rank 2 fails in step 2 (index), while ranks 0 and 1 are inside it.
  const auto f = fail_one_replica<S>(3, 2, 2, [] { return gw::aggregation::central(0); });
  check_replica_failure(f, 2);
}

TEST_CASE("local_sgd (averaging<2>): a replica that throws in an averaging step fails the others with peer_lost naming it, and run_inproc rethrows its own error") {
  using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::averaging<2>, counting_inproc>;
  // Steps 1 and 3 average (every second step); rank 1 fails in step 3, while ranks 0 and 2 are inside it.
  const auto f = fail_one_replica<S>(3, 1, 3, [] { return gw::aggregation::averaging<2>(); });
  check_replica_failure(f, 1);
}

// --- the parameter server's protocol ----------------------------------------------------

namespace psd = gw::ps::detail;
using ps_strategy = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync, counting_inproc>;

ps_strategy make_ps(gw::transport::inproc t, counting_inproc::counters& counters) {
  gw::ps::options o;
  o.servers = 1;
  o.timeout = patience;
  return ps_strategy(counting_inproc(t, counters), model_params(t.rank()), gw::optim::sgd({.lr = 0.1}), ps_strategy::aggregation_type(o),
                     {.timeout = patience});
}

std::size_t model_elements() {
  std::size_t n = 0;
  for (auto s : model_sizes) n += s;
  return n;
}

TEST_CASE("parameter server: a worker that sends an unknown request kind is refused with protocol, naming both ranks and the kind") {
  // Ranks 0 and 1 are workers, rank 2 the server. Rank 1 is set up like any worker, then
  // sends the server a request header of kind 7 on the request tag, as a worker of
  // another gradwire build might, once rank 0 has posted every message of its step (its
  // push, and its pull: the reply's receive, then the request) and so waits for the server.
  constexpr int ranks = 3, server = 2, rogue = 1;
  constexpr std::uint32_t bad_kind = 7;
  std::vector<outcome> got(ranks);
  std::vector<counting_inproc::counters> counters(ranks);
  std::atomic<bool> sent{false};
  const outcome rethrown = outcome_of([&] {
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      const int me = t.rank();
      auto& mine = counters[static_cast<std::size_t>(me)];
      try {
        auto s = make_ps(t, mine);
        if (me == server) {
          s.serve();
          throw std::runtime_error("the server finished although a worker sent an unknown request kind");
        }
        if (me == rogue) {
          auto& zero = counters[0];
          await([&] { return zero.receives.load() > 0 && zero.sends_after_receive.load() > 0; },
                "worker 0 to post its step's pull");
          auto& tr = s.communicator().transport();
          psd::request_header h;
          std::memcpy(&h.kind, &bad_kind, sizeof bad_kind);
          h.clock = 1;
          auto send = tr.async_send(server, psd::request_tag, psd::bytes_of(h));
          tr.wait(send, gw::clock::now() + patience);
          sent = true;
          // The server's answer: its failure (a reply would be a defence missing).
          std::vector<std::byte> reply(sizeof(psd::reply_header) + model_elements() * sizeof(float));
          auto r = tr.async_recv(server, psd::reply_tag, reply);
          tr.wait(r, gw::clock::now() + patience);
          throw std::runtime_error("the server answered a request of an unknown kind");
        }
        mine.armed = true;
        s.step(model_gradients(me, 0));  // rank 0: a step the server never completes
        throw std::runtime_error("worker 0's step completed although the server failed");
      } catch (const gw::error& e) {
        got[static_cast<std::size_t>(me)] = {e.kind(), e.what()};
        throw;
      }
    });
  });
  const std::string words = "parameter server rank 2: worker rank 1 sent an unknown request kind 7; do all ranks run "
                            "the same gradwire build?";
  REQUIRE(sent);
  CAPTURE(got[0].what, got[1].what, got[2].what);
  REQUIRE(got[server].kind == errc::protocol);
  REQUIRE_THAT(got[server].what, Catch::StartsWith(words));
  // The other worker loses its server: peer_lost naming it and the server's reason, with what to do.
  REQUIRE(got[0].kind == errc::peer_lost);
  // Its pull's receive: the reply header and the whole model (one server holds it all).
  const std::size_t reply_bytes = sizeof(psd::reply_header) + model_elements() * sizeof(float);
  REQUIRE_THAT(got[0].what, Catch::StartsWith("parameter_server: rank 0: receive from rank 2 (tag " +
                                              std::to_string(psd::reply_tag) + ", " + std::to_string(reply_bytes) +
                                              " bytes)") &&
                                Catch::Contains("rank 2 failed: " + words) &&
                                Catch::Contains("restart the job with the same checkpoint directory"));
  REQUIRE(got[rogue].kind == errc::peer_lost);
  REQUIRE_THAT(got[rogue].what, Catch::Contains("rank 2 failed: " + words));
  REQUIRE(rethrown.kind == errc::protocol);
  REQUIRE(rethrown.what == got[server].what);
}

TEST_CASE("parameter server: a worker refuses a reply whose staleness exceeds its version, naming the server, both versions and the staleness") {
  // Rank 0 is a worker; rank 1 is set up as the server, then answers the worker's setup
  // pull by hand with a reply of version 2 and staleness 3 (a staleness beyond the version).
  constexpr int server = 1, worker = 0;
  std::vector<outcome> got(2);
  psd::request_header pull{};
  bool pulled = false;
  std::vector<counting_inproc::counters> counters(2);
  const outcome rethrown = outcome_of([&] {
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      const int me = t.rank();
      auto& mine = counters[static_cast<std::size_t>(me)];
      try {
        if (me == worker) {
          auto s = make_ps(t, mine);  // set-up ends with a pull from the server
          throw std::runtime_error("the worker took a reply whose staleness exceeds its version");
        }
        auto s = make_ps(t, mine);
        auto& tr = s.communicator().transport();
        auto r = tr.async_recv(worker, psd::request_tag, psd::writable_bytes_of(pull));
        tr.wait(r, gw::clock::now() + patience);
        pulled = true;
        std::vector<std::byte> reply(sizeof(psd::reply_header) + model_elements() * sizeof(float));
        psd::reply_header h;
        h.version = 2;
        h.staleness = 3;
        std::memcpy(reply.data(), &h, sizeof h);
        auto send = tr.async_send(worker, psd::reply_tag, reply);
        tr.wait(send, gw::clock::now() + patience);
        // The worker's next word: a failure, or (a defence missing) its done request.
        psd::request_header next{};
        auto more = tr.async_recv(worker, psd::request_tag, psd::writable_bytes_of(next));
        tr.wait(more, gw::clock::now() + patience);
        throw std::runtime_error("the worker carried on after a reply whose staleness exceeds its version");
      } catch (const gw::error& e) {
        got[static_cast<std::size_t>(me)] = {e.kind(), e.what()};
        throw;
      }
    });
  });
  REQUIRE(pulled);
  REQUIRE(pull.kind == psd::request_kind::pull);
  CAPTURE(got[0].what, got[1].what);
  // The pull asked for version pull.version (0 at setup); the reply's 2 and 3 are named beside it.
  REQUIRE(got[worker].kind == errc::protocol);
  REQUIRE_THAT(got[worker].what,
               Catch::Contains("parameter_server: server rank 1 sent a reply of version 2 with staleness 3 to a pull "
                               "for version " +
                               std::to_string(pull.version) + "; do all ranks run the same gradwire build?"));
  REQUIRE(got[server].kind == errc::peer_lost);
  REQUIRE_THAT(got[server].what, Catch::Contains("rank 0 failed: parameter_server: server rank 1 sent a reply"));
  REQUIRE(rethrown.kind == errc::protocol);
  REQUIRE(rethrown.what == got[worker].what);
}

#if defined(GRADWIRE_HAS_ASIO)
// --- a message of the wrong size over TCP ----------------------------------------------

TEST_CASE("asio_tcp: a message larger or smaller than its receive is a mismatch naming both ranks, both sizes and the tag, and the link goes on") {
  using gw::transport::asio_tcp;
  const std::uint16_t store_port = [] {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
  }();
  auto options = [&](int rank) {
    gw::transport::asio_tcp_options o;
    o.rank = rank;
    o.size = 2;
    o.job_token = "documented-failures-tcp";
    o.store_port = store_port;
    o.connect_timeout = patience;
    return o;
  };
  event posted;
  outcome larger, smaller, after;
  std::vector<std::byte> last(16);
  std::exception_ptr errors[2];
  auto run = [&](int rank, auto body) {
    return std::thread([&, rank, body] {
      try {
        asio_tcp t(options(rank));
        body(t);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  };
  std::thread t0 = run(0, [&](asio_tcp& t) {
    std::vector<std::byte> small(4000), big(4096);
    auto r1 = t.async_recv(1, 65536, small);  // rank 1 sends 4096 bytes
    auto r2 = t.async_recv(1, 65537, big);    // rank 1 sends 4000 bytes
    auto r3 = t.async_recv(1, 65538, last);   // the right size
    posted.raise();
    larger = outcome_of([&] { t.wait(r1, gw::clock::now() + patience); });
    smaller = outcome_of([&] { t.wait(r2, gw::clock::now() + patience); });
    after = outcome_of([&] { t.wait(r3, gw::clock::now() + patience); });
    const std::byte done{1};
    auto a = t.async_send(1, 99, {&done, 1});
    t.wait(a, gw::clock::now() + patience);
  });
  std::thread t1 = run(1, [&](asio_tcp& t) {
    posted.await("rank 0's receives");
    const std::vector<std::byte> m4096(4096, std::byte{1}), m4000(4000, std::byte{2}), m16(16, std::byte{3});
    auto s1 = t.async_send(0, 65536, m4096);
    auto s2 = t.async_send(0, 65537, m4000);
    auto s3 = t.async_send(0, 65538, m16);
    for (auto* s : {&s1, &s2, &s3}) t.wait(*s, gw::clock::now() + patience);
    std::byte done{};
    auto a = t.async_recv(0, 99, {&done, 1});
    t.wait(a, gw::clock::now() + patience);
  });
  t0.join();
  t1.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  CAPTURE(larger.what, smaller.what, after.what);
  REQUIRE(larger.kind == errc::mismatch);
  REQUIRE_THAT(larger.what, Catch::Contains("message size mismatch: rank 1 sent 4096 bytes (tag 65536) but rank 0 expected 4000"));
  REQUIRE(smaller.kind == errc::mismatch);
  REQUIRE_THAT(smaller.what, Catch::Contains("message size mismatch: rank 1 sent 4000 bytes (tag 65537) but rank 0 expected 4096"));
  REQUIRE_FALSE(after.failed());
  REQUIRE(last == std::vector<std::byte>(16, std::byte{3}));
}
#endif  // GRADWIRE_HAS_ASIO

}  // namespace
