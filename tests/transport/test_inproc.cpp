// In-process transport: tag matching, sizes, timeouts, cancellation and failure propagation.
#include <catch2/catch.hpp>

#include "helpers/errors.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <gradwire/transport/inproc.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace gw = gradwire;
using gw::transport::inproc;
using namespace std::chrono_literals;

namespace {
std::span<const std::byte> bytes(const std::vector<int>& v) { return std::as_bytes(std::span(v)); }
std::span<std::byte> bytes(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }

using gradwire::testing::error_of;
}  // namespace

TEST_CASE("inproc delivers messages by tag, in posting order within a tag") {
  gw::transport::inproc_group group(2);
  std::vector<int> first(5), second(5), third(3);
  auto outcomes = group.run([&](inproc t) {
    const auto until = gw::clock::now() + 10s;
    if (t.rank() == 0) {
      std::vector<int> a{1, 2, 3, 4, 5}, b{6, 7, 8, 9, 10}, c{11, 12, 13};
      auto s3 = t.async_send(1, 7, bytes(c));  // other tag, sent first
      auto s1 = t.async_send(1, 5, bytes(a));
      auto s2 = t.async_send(1, 5, bytes(b));
      t.wait(s1, until), t.wait(s2, until), t.wait(s3, until);
    } else {
      auto r1 = t.async_recv(0, 5, bytes(first));
      auto r2 = t.async_recv(0, 5, bytes(second));
      auto r3 = t.async_recv(0, 7, bytes(third));
      t.wait(r2, until), t.wait(r1, until), t.wait(r3, until);
    }
  });
  for (auto& e : outcomes) REQUIRE_FALSE(e);
  REQUIRE(first == std::vector<int>{1, 2, 3, 4, 5});
  REQUIRE(second == std::vector<int>{6, 7, 8, 9, 10});
  REQUIRE(third == std::vector<int>{11, 12, 13});
}

TEST_CASE("inproc carries empty messages and messages to self") {
  gw::transport::inproc_group group(1);
  auto t = group.endpoint(0);
  std::vector<int> out{42, 43}, in(2), none_out, none_in;
  auto r = t.async_recv(0, 1, bytes(in));
  auto s = t.async_send(0, 1, bytes(out));
  auto r0 = t.async_recv(0, 2, bytes(none_in));
  auto s0 = t.async_send(0, 2, bytes(none_out));
  const auto until = gw::clock::now() + 1s;
  t.wait(r, until), t.wait(s, until), t.wait(r0, until), t.wait(s0, until);
  REQUIRE(in == out);
}

TEST_CASE("inproc reports a receive nobody sends as a timeout, near its deadline") {
  gw::transport::inproc_group group(2);
  auto t = group.endpoint(1);
  std::vector<int> in(4);
  auto r = t.async_recv(0, 9, bytes(in));
  const auto start = std::chrono::steady_clock::now();
  auto [kind, what] = error_of([&] { t.wait(r, gw::clock::now() + 150ms); });
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(kind == gw::errc::timeout);
  REQUIRE_THAT(what, Catch::Contains("receive from rank 0") && Catch::Contains("deadline"));
  REQUIRE(waited >= 150ms);
  REQUIRE(waited < 5s);
  // The timed-out receive was withdrawn: a later send is matched by a new receive.
  std::vector<int> out{1, 2, 3, 4}, again(4);
  auto sender = group.endpoint(0);
  auto s = sender.async_send(1, 9, bytes(out));
  auto r2 = t.async_recv(0, 9, bytes(again));
  t.wait(r2, gw::clock::now() + 1s);
  sender.wait(s, gw::clock::now() + 1s);
  REQUIRE(again == out);
}

TEST_CASE("inproc rejects a message whose size differs from the receive, on both sides") {
  gw::transport::inproc_group group(2);
  auto outcomes = group.run([&](inproc t) {
    std::vector<int> buffer(t.rank() == 0 ? 3 : 4);
    auto r = t.rank() == 0 ? t.async_send(1, 1, bytes(std::as_const(buffer))) : t.async_recv(0, 1, bytes(buffer));
    t.wait(r, gw::clock::now() + 10s);
  });
  for (auto& e : outcomes) {
    REQUIRE(e);
    REQUIRE_THROWS_WITH(std::rethrow_exception(e), Catch::Contains("sent 12 bytes") && Catch::Contains("expected 16"));
  }
}

TEST_CASE("a failing rank turns its peers' waits into peer_lost at once, naming it") {
  gw::transport::inproc_group group(4);
  // Rank 2 fails only once the other three have posted the receives it will never answer, so
  // it is their pending operations that fail (new ones are refused at once: below).
  std::mutex mutex;
  std::condition_variable posted;
  int receives_posted = 0;
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = group.run([&](inproc t) {
    if (t.rank() == 2) {
      std::unique_lock lock(mutex);
      if (!posted.wait_for(lock, 10s, [&] { return receives_posted == 3; }))
        throw std::logic_error("the other ranks did not post their receives within 10 s");
      throw std::runtime_error("out of memory in rank 2's forward pass");
    }
    std::vector<int> in(1);
    auto r = t.async_recv(2, 1, bytes(in));  // rank 2 never sends
    {
      std::lock_guard lock(mutex);
      ++receives_posted;
    }
    posted.notify_all();
    t.wait(r, gw::clock::now() + 60s);
  });
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);  // far below the 60 s deadline
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    REQUIRE(outcomes[r]);
    if (r == 2) {
      REQUIRE_THROWS_WITH(std::rethrow_exception(outcomes[r]), "out of memory in rank 2's forward pass");
      continue;
    }
    try {
      std::rethrow_exception(outcomes[r]);
    } catch (const gw::error& e) {
      REQUIRE(e.kind() == gw::errc::peer_lost);
      REQUIRE_THAT(e.what(), Catch::Contains("rank " + std::to_string(r) + ": receive from rank 2 (tag 1, 4 bytes)") &&
                                 Catch::Contains("rank 2 failed: out of memory in rank 2's forward pass"));
    }
  }
  // New operations on a failed group fail at once too.
  std::vector<int> in(1);
  REQUIRE_THROWS_AS(group.endpoint(0).async_recv(1, 5, bytes(in)), gw::error);
}

TEST_CASE("run_inproc rethrows the root cause, not its peer_lost echoes") {
  REQUIRE_THROWS_WITH(gw::transport::run_inproc(3,
                                                [](inproc t) {
                                                  if (t.rank() == 1) throw std::logic_error("the real problem");
                                                  std::vector<int> in(1);
                                                  auto r = t.async_recv(1, 1, bytes(in));
                                                  t.wait(r, gw::clock::now() + 60s);
                                                }),
                      "the real problem");
}

// The race of test_bad_input's "bad options ... on every rank": ranks given the same bad
// setting check it after a collective; the first through throws, and a rank still waiting
// on a third rank in that collective heard of the failure before reaching its own check.
// It must report the kind the others report, not a lost peer. Here the failing rank (2)
// throws only once rank 0 waits on a send to rank 1 and rank 1 on a receive from rank 2.
TEST_CASE("a rank that fails with a config, timeout or mismatch error gives that kind to every peer, also one "
          "waiting on a third rank, and run_inproc rethrows its own error, not an echo") {
  using gw::errc;
  for (const errc kind : {errc::config, errc::timeout, errc::mismatch, errc::invalid_argument}) {
    CAPTURE(kind);
    const std::string reason = "parameter_server: the job's setting is bad";
    gw::transport::inproc_group group(3);
    std::mutex mutex;
    std::condition_variable posted;
    int waiting = 0;
    auto outcomes = group.run([&](inproc t) {
      std::vector<int> one(1);
      if (t.rank() == 2) {
        std::unique_lock lock(mutex);
        if (!posted.wait_for(lock, 10s, [&] { return waiting == 2; }))
          throw std::logic_error("ranks 0 and 1 did not post within 10 s");
        throw gw::error(kind, reason);
      }
      auto r = t.rank() == 0 ? t.async_send(1, 1, bytes(std::as_const(one))) : t.async_recv(2, 1, bytes(one));
      {
        std::lock_guard lock(mutex);
        ++waiting;
      }
      posted.notify_all();
      t.wait(r, gw::clock::now() + 60s);
    });
    const errc heard = kind == errc::invalid_argument ? errc::peer_lost : kind;
    const std::string waited_on[2] = {"rank 0: send to rank 1 (tag 1, 4 bytes)", "rank 1: receive from rank 2 (tag 1, 4 bytes)"};
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(outcomes[r]);
      const auto [got, what] = error_of([&] { std::rethrow_exception(outcomes[r]); });
      CAPTURE(what);
      REQUIRE(got == heard);
      REQUIRE_THAT(what, Catch::StartsWith(waited_on[r]) && Catch::Contains("rank 2 failed: " + reason));
    }
    // The root cause is rank 2's own error, although ranks 0 and 1 failed first in rank order
    // with the same kind.
    const auto root = error_of([&] { gw::transport::detail::rethrow_root_cause(outcomes); });
    REQUIRE(root.first == kind);
    REQUIRE_THAT(root.second, Catch::StartsWith(reason));
  }
}

TEST_CASE("a request destroyed before completion is withdrawn") {
  gw::transport::inproc_group group(2);
  auto receiver = group.endpoint(1), sender = group.endpoint(0);
  std::vector<int> out{7, 8};
  {
    std::vector<int> doomed(2, -1);
    auto r = receiver.async_recv(0, 3, bytes(doomed));
  }  // r and its buffer go away unmatched
  std::vector<int> in(2);
  auto s = sender.async_send(1, 3, bytes(out));
  auto r = receiver.async_recv(0, 3, bytes(in));
  receiver.wait(r, gw::clock::now() + 1s);
  sender.wait(s, gw::clock::now() + 1s);
  REQUIRE(in == out);
}

TEST_CASE("inproc rejects peers outside the group and empty groups") {
  gw::transport::inproc_group group(2);
  std::vector<int> in(1);
  auto [kind, what] = error_of([&] { group.endpoint(0).async_recv(2, 1, bytes(in)); });
  REQUIRE(kind == gw::errc::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("rank 2"));
  REQUIRE_THROWS_AS(gw::transport::inproc_group(0), gw::error);
  REQUIRE_THROWS_AS(group.endpoint(2), gw::error);
}

TEST_CASE("inproc refuses a tag at or above 2^48 - 1 with invalid_argument naming it, as every transport does") {
  gw::transport::inproc_group group(2);
  auto a = group.endpoint(0), b = group.endpoint(1);
  std::vector<int> in(1), out{42};
  for (std::uint64_t tag : {(std::uint64_t{1} << 48) - 1, std::uint64_t{1} << 48, ~std::uint64_t{0}}) {
    CAPTURE(tag);
    auto [kind, what] = error_of([&] { a.async_recv(1, tag, bytes(in)); });
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE_THAT(what, Catch::Contains("inproc: tag " + std::to_string(tag) + " is not below 2^48 - 1"));
    REQUIRE(error_of([&] { b.async_send(0, tag, bytes(std::as_const(out))); }).first == gw::errc::invalid_argument);
  }
  // The largest tag below the limit is delivered.
  const std::uint64_t largest = (std::uint64_t{1} << 48) - 2;
  auto r = a.async_recv(1, largest, bytes(in));
  auto s = b.async_send(0, largest, bytes(std::as_const(out)));
  a.wait(r, gw::clock::now() + 5s);
  b.wait(s, gw::clock::now() + 5s);
  REQUIRE(in == out);
}

TEST_CASE("inproc moves large messages intact between many ranks at once") {
  constexpr int ranks = 6;
  constexpr std::size_t n = 1 << 18;
  // Catch's assertions are not thread-safe: ranks throw, and the test thread asserts.
  REQUIRE_NOTHROW(gw::transport::run_inproc(ranks, [&](inproc t) {
    const int me = t.rank(), to = (me + 1) % ranks, from = (me + ranks - 1) % ranks;
    std::vector<int> out(n), in(n, -1);
    std::iota(out.begin(), out.end(), me * 1000);
    auto r = t.async_recv(from, 1, bytes(in));
    auto s = t.async_send(to, 1, bytes(std::as_const(out)));
    t.wait(r, gw::clock::now() + 30s);
    t.wait(s, gw::clock::now() + 30s);
    for (std::size_t i = 0; i < n; ++i)
      if (in[i] != int(from * 1000 + i))
        throw std::runtime_error("element " + std::to_string(i) + " from rank " + std::to_string(from) + " is " +
                                 std::to_string(in[i]));
  }));
}

TEST_CASE("async_recv_accumulate adds the message into the receive buffer, on either side's wait") {
  gw::transport::inproc_group group(2);
  auto sender = group.endpoint(0), receiver = group.endpoint(1);
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (const std::size_t n : {0u, 1u, 7u, 1000003u}) {
    std::vector<float> out(n), inout(n);
    for (auto& x : out) x = static_cast<float>(dist(gen));
    for (auto& x : inout) x = static_cast<float>(dist(gen));
    std::vector<double> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = double(inout[i]) + double(out[i]);
    // The receive is posted first, so the bytes move in whichever wait comes first:
    // here the sender's, which must not wait for the receiver to call wait.
    auto r = receiver.async_recv_accumulate(0, 4, std::span<float>(inout));
    auto s = sender.async_send(1, 4, std::as_bytes(std::span<const float>(out)));
    sender.wait(s, gw::clock::now() + 1s);
    receiver.wait(r, gw::clock::now() + 1s);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += std::abs(double(inout[i]) - expected[i]) > 2 * std::numeric_limits<float>::epsilon();
    REQUIRE(wrong == 0);
  }
  // A size mismatch is reported, and nothing is added.
  std::vector<float> out(3, 1.0f), inout(4, 2.0f);
  auto s = sender.async_send(1, 5, std::as_bytes(std::span<const float>(out)));
  auto r = receiver.async_recv_accumulate(0, 5, std::span<float>(inout));
  auto [kind, what] = error_of([&] { receiver.wait(r, gw::clock::now() + 1s); });
  REQUIRE(kind == gw::errc::mismatch);
  REQUIRE_THAT(what, Catch::Contains("sent 12 bytes") && Catch::Contains("expected 16"));
  REQUIRE(inout == std::vector<float>(4, 2.0f));
}

TEST_CASE("a matched receive destroyed before its bytes moved hands its send to the next receive") {
  gw::transport::inproc_group group(2);
  auto receiver = group.endpoint(1), sender = group.endpoint(0);
  std::vector<int> out{5, 6, 7}, in(3);
  std::optional<inproc::request> s;
  {
    std::vector<int> doomed(3, -1);
    auto r = receiver.async_recv(0, 2, bytes(doomed));
    s = sender.async_send(1, 2, bytes(out));  // matched: ready, nothing moved yet
  }  // the receive and its buffer go away: the send must not write into them
  auto r = receiver.async_recv(0, 2, bytes(in));
  receiver.wait(r, gw::clock::now() + 1s);
  sender.wait(*s, gw::clock::now() + 1s);
  REQUIRE(in == out);
}

TEST_CASE("waiting again on a request that timed out is an error, not a hang") {
  gw::transport::inproc_group group(2);
  auto t = group.endpoint(0);
  std::vector<int> in(1);
  auto r = t.async_recv(1, 1, bytes(in));
  REQUIRE(error_of([&] { t.wait(r, gw::clock::now() + 20ms); }).first == gw::errc::timeout);
  const auto start = std::chrono::steady_clock::now();
  auto [kind, what] = error_of([&] { t.wait(r, gw::clock::now() + 20ms); });
  REQUIRE(kind == gw::errc::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("finished request"));
  REQUIRE(std::chrono::steady_clock::now() - start < 1s);
}

TEST_CASE("a matched send destroyed before its bytes moved hands its receive to the next send") {
  gw::transport::inproc_group group(2);
  auto receiver = group.endpoint(1), sender = group.endpoint(0);
  std::vector<int> wrong{-1, -1}, right{3, 4}, in(2);
  auto r = receiver.async_recv(0, 6, bytes(in));
  { auto doomed = sender.async_send(1, 6, bytes(wrong)); }  // matched, then withdrawn unmoved
  auto s = sender.async_send(1, 6, bytes(right));
  receiver.wait(r, gw::clock::now() + 1s);
  sender.wait(s, gw::clock::now() + 1s);
  REQUIRE(in == right);
}

TEST_CASE("requests completed by the peer can be dropped at any moment while ranks fail") {
  // Ranks post, then throw before waiting, while their peers move bytes: the requests
  // die while the other side may still be finishing. Repeated to give races a chance.
  for (int round = 0; round < 200; ++round) {
    gw::transport::inproc_group group(2);
    auto outcomes = group.run([&](inproc t) {
      std::vector<int> out(64, t.rank()), in(64);
      auto r = t.async_recv(1 - t.rank(), 1, bytes(in));
      auto s = t.async_send(1 - t.rank(), 1, bytes(std::as_const(out)));
      if (t.rank() == round % 2) throw std::runtime_error("fails before waiting");
      t.wait(r, gw::clock::now() + 10s);
      t.wait(s, gw::clock::now() + 10s);
    });
    REQUIRE(outcomes[round % 2]);
  }
}

TEST_CASE("inproc wait_any returns the request whose peer spoke, skips empty ones, and times out") {
  gw::transport::inproc_group group(3);
  std::vector<std::size_t> order;
  std::vector<int> in1(1), in2(1);
  std::optional<gw::errc> last_wait;
  auto outcomes = group.run([&](inproc t) {
    const auto until = gw::clock::now() + 10s;
    std::vector<int> one{1};
    if (t.rank() == 0) {
      auto from1 = t.async_recv(1, 3, bytes(in1));
      auto from2 = t.async_recv(2, 3, bytes(in2));
      inproc::request empty;
      std::vector<inproc::request*> pending{&from1, &empty, &from2};
      // Rank 2 speaks first (rank 1 waits for our go), so wait_any must name it.
      const std::size_t first = t.wait_any(pending, until);
      order.push_back(first);
      t.wait(*pending[first], until);
      auto go = t.async_send(1, 4, bytes(one));
      t.wait(go, until);
      pending[first] = nullptr;
      const std::size_t second = t.wait_any(pending, until);
      order.push_back(second);
      t.wait(*pending[second], until);
      // Nothing more will come: a deadline, not a hang.
      std::vector<int> spare(1);
      auto never = t.async_recv(1, 9, bytes(spare));
      std::vector<inproc::request*> last{&never};
      try {
        t.wait_any(last, gw::clock::now() + 50ms);
      } catch (const gw::error& e) {
        last_wait = e.kind();
      }
    } else if (t.rank() == 1) {
      std::vector<int> go(1);
      auto r = t.async_recv(0, 4, bytes(go));
      t.wait(r, until);
      auto s = t.async_send(0, 3, bytes(one));
      t.wait(s, until);
    } else {
      auto s = t.async_send(0, 3, bytes(one));
      t.wait(s, until);
    }
  });
  for (auto& e : outcomes) REQUIRE_FALSE(e);
  REQUIRE(order == std::vector<std::size_t>{2, 0});
  REQUIRE(in1 == std::vector<int>{1});
  REQUIRE(in2 == std::vector<int>{1});
  REQUIRE(last_wait == gw::errc::timeout);
}

TEST_CASE("the wait policy spins only with a CPU to spare, and yields before it sleeps") {
  using gw::transport::choose_wait_policy;
  using std::chrono::microseconds;
  // A CPU beyond one per rank: a short spin, then yields, 50 us in all.
  const auto spare = choose_wait_policy(2, 4);
  REQUIRE(spare.spin > microseconds(0));
  REQUIRE(spare.spin <= microseconds(2));
  REQUIRE(spare.spin + spare.yield == microseconds(50));
  // A CPU per rank and no more, or fewer CPUs than ranks: no spin (the peer may share
  // this CPU), yields only.
  for (auto [ranks, cpus] : {std::pair{2, 2u}, {4, 2u}, {16, 2u}, {64, 1u}, {1, 1u}}) {
    INFO(ranks << " ranks on " << cpus << " CPUs");
    const auto p = choose_wait_policy(ranks, cpus);
    REQUIRE(p.spin == microseconds(0));
    REQUIRE(p.yield == microseconds(50));
  }
  // Nonsense counts read as one.
  REQUIRE(choose_wait_policy(0, 0) == choose_wait_policy(1, 1));
  // A group takes the policy for its size on this process's CPUs unless told one.
  REQUIRE(gw::transport::inproc_group(3).wait_policy() ==
          choose_wait_policy(3, gw::support::usable_cpus()));
  const gw::transport::inproc_wait_policy block{};
  REQUIRE(gw::transport::inproc_group(3, block).wait_policy() == block);
}

TEST_CASE("every wait policy delivers, and a wait ends at its deadline even inside a long spin") {
  using std::chrono::microseconds;
  const gw::transport::inproc_wait_policy policies[] = {
      {},                                 // sleep at once
      {microseconds(0), microseconds(50)},  // yield
      {microseconds(1), microseconds(49)},  // spin, then yield
      {std::chrono::seconds(10), std::chrono::seconds(10)},  // far past the deadline below
  };
  for (const auto& policy : policies) {
    INFO("spin " << policy.spin.count() << " ns, yield " << policy.yield.count() << " ns");
    // A ring shift on 4 ranks, both directions of each message waited on.
    gw::transport::inproc_group group(4, policy);
    std::vector<std::vector<int>> got(4, std::vector<int>(1000));
    auto outcomes = group.run([&](inproc t) {
      const int me = t.rank(), n = t.size();
      std::vector<int> mine(1000);
      std::iota(mine.begin(), mine.end(), me * 1000);
      for (int round = 0; round < 20; ++round) {
        auto r = t.async_recv((me + n - 1) % n, round, bytes(got[me]));
        auto s = t.async_send((me + 1) % n, round, bytes(std::as_const(mine)));
        const auto until = gw::clock::now() + 10s;
        t.wait(s, until), t.wait(r, until);
      }
    });
    for (auto& e : outcomes) REQUIRE_FALSE(e);
    for (int r = 0; r < 4; ++r) {
      std::vector<int> expected(1000);
      std::iota(expected.begin(), expected.end(), ((r + 3) % 4) * 1000);
      REQUIRE(got[r] == expected);
    }
    // A receive nobody sends: a timeout at its deadline, however long the policy polls.
    auto t = group.endpoint(1);
    std::vector<int> in(4);
    auto r = t.async_recv(0, 99, bytes(in));
    const auto start = std::chrono::steady_clock::now();
    auto [kind, what] = error_of([&] { t.wait(r, gw::clock::now() + 100ms); });
    const auto waited = std::chrono::steady_clock::now() - start;
    REQUIRE(kind == gw::errc::timeout);
    REQUIRE(waited >= 100ms);
    REQUIRE(waited < 5s);
  }
}

TEST_CASE("after a slow yield a rank sleeps for a back-off that doubles while slow yields keep coming") {
  using namespace gw::transport::detail;
  using std::chrono::milliseconds;
  // The first slow yield, or one long after the last: the shortest back-off.
  REQUIRE(yield_strikes_after(0, milliseconds(1000)) == 1);
  REQUIRE(yield_strikes_after(5, yield_strikes_forgotten + milliseconds(1)) == 1);
  REQUIRE(yield_back_off(1) == first_yield_back_off);
  // Slow yields close together double it, up to the cap.
  int strikes = 0;
  gw::clock::duration previous{};
  for (int i = 1; i <= 20; ++i) {
    strikes = yield_strikes_after(strikes, milliseconds(5));
    const auto back_off = yield_back_off(strikes);
    if (i > 1 && i <= max_yield_strikes) REQUIRE(back_off == 2 * previous);
    if (i >= max_yield_strikes) REQUIRE(back_off == first_yield_back_off * (1 << (max_yield_strikes - 1)));
    previous = back_off;
  }
  REQUIRE(strikes == max_yield_strikes);
}
