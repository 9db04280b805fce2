// Broadcast from every root and the barrier's one guarantee: nobody leaves before all arrive.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <gradwire/transport/inproc.hpp>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;

TEST_CASE("broadcast copies the root's buffer to every rank, for every root") {
  // Up to 16 floats (64 bytes) the data reaches the root's right neighbour inside the call
  // check's frame; from 17 on, as messages of its own.
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 16, 17, 100003);
  for (int root = 0; root < ranks; ++root) {
    CAPTURE(ranks, n, root);
    std::vector<std::vector<float>> data(ranks, std::vector<float>(n));
    std::mt19937 gen(std::random_device{}());
    std::uniform_real_distribution<float> dist(-5, 5);
    for (auto& d : data)
      for (auto& x : d) x = dist(gen);
    const std::vector<float> expected = data[root];
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      gw::collective::communicator comm(t, {.timeout = std::chrono::seconds(60)});
      gw::collective::broadcast(comm, std::span<float>(data[t.rank()]), root);
    });
    for (int r = 0; r < ranks; ++r) REQUIRE(data[r] == expected);
  }
}

TEST_CASE("broadcast rejects a root outside the group") {
  gw::transport::inproc_group group(1);
  gw::collective::communicator comm(group.endpoint(0));
  std::vector<float> v(3);
  REQUIRE_THROWS_MATCHES(gw::collective::broadcast(comm, std::span<float>(v), 1), gw::error,
                         gw::test::is_error(gw::errc::invalid_argument, {"broadcast: root 1 outside 0..0"}));
  REQUIRE_THROWS_MATCHES(gw::collective::broadcast(comm, std::span<float>(v), -1), gw::error,
                         gw::test::is_error(gw::errc::invalid_argument, {"broadcast: root -1 outside 0..0"}));
}

namespace {

using status = gw::transport::detail::inproc_op::status;

// What the barrier test sees of every rank: the round it is in, when it left, and the
// operation it is blocked on (null while it is not in a wait). `events` changes before
// every message a rank posts and whenever a rank enters or leaves a wait.
struct barrier_watch {
  explicit barrier_watch(int ranks)
      : round(static_cast<std::size_t>(ranks), 0), left_round(static_cast<std::size_t>(ranks), 0),
        blocked_on(static_cast<std::size_t>(ranks), nullptr) {}
  std::mutex mutex;
  std::vector<int> round, left_round;                                // guarded by mutex
  std::vector<const gw::transport::detail::inproc_op*> blocked_on;  // guarded by mutex
  std::atomic<std::uint64_t> events{0};

  // Whether every rank but `held` is either out of round k's barrier already, or blocked in
  // round k on an operation nobody has matched. Nobody posts while every rank is blocked
  // (events unchanged from before the first look to after the last) and `held` is held:
  // then no rank but `held` can ever go on, the state the test holds `held` back for.
  bool all_stuck_but(int held, int k) {
    const std::uint64_t before = events.load();
    for (std::size_t r = 0; r < round.size(); ++r) {
      if (static_cast<int>(r) == held) continue;
      std::lock_guard lock(mutex);
      const bool out = left_round[r] >= k;
      const bool stuck = round[r] == k && blocked_on[r] != nullptr && blocked_on[r]->now() == status::posted;
      if (!out && !stuck) return false;
    }
    return events.load() == before;
  }
};

// inproc that reports to the watch. A wait first waits (wait_any) until its operation is
// matched, while the request still owns it, so the watch may look at it; then it finishes.
struct watched_inproc {
  using request = gw::transport::inproc::request;
  gw::transport::inproc inner;
  barrier_watch* watch;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) {
    ++watch->events;
    return inner.async_send(peer, tag, b);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) {
    ++watch->events;
    return inner.async_recv(peer, tag, b);
  }
  void wait(request& r, gw::deadline until) {
    const auto me = static_cast<std::size_t>(rank());
    {
      std::lock_guard lock(watch->mutex);
      watch->blocked_on[me] = r.peek();
    }
    ++watch->events;
    request* one[] = {&r};
    try {
      inner.wait_any(std::span<request* const>(one), until);
    } catch (const gw::error&) {  // the wait below reports it in its own words
    }
    {
      std::lock_guard lock(watch->mutex);
      watch->blocked_on[me] = nullptr;
    }
    ++watch->events;
    inner.wait(r, until);
  }
};
static_assert(gw::concepts::transport<watched_inproc>);

}  // namespace

TEST_CASE("no rank leaves a barrier before every rank has entered it") {
  // In each round one rank (a different one each round) is held back from the barrier until
  // every other rank is provably stuck inside it: blocked on a message nobody has sent, with
  // no rank but the held one able to post another. Only then does the held rank enter. A
  // barrier that let any rank through without the held one shows as a rank that left
  // before the held rank entered (the order of `clock` ticks), whatever the timing.
  const int ranks = GENERATE(2, 3, 5, 8);
  CAPTURE(ranks);
  constexpr int rounds = 4;
  barrier_watch watch(ranks);
  std::atomic<std::uint64_t> clock{0};
  std::vector<std::uint64_t> held_entered(rounds + 1, 0);
  std::vector<std::vector<std::uint64_t>> left(rounds + 1, std::vector<std::uint64_t>(static_cast<std::size_t>(ranks), 0));
  std::atomic<int> holds_given_up{0};
  auto held_in = [&](int k) { return (ranks - k % ranks) % ranks; };  // the last rank, then the one before it, ...
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    gw::collective::communicator comm(watched_inproc{t, &watch}, {.timeout = std::chrono::seconds(30)});
    for (int k = 1; k <= rounds; ++k) {
      {
        std::lock_guard lock(watch.mutex);
        watch.round[static_cast<std::size_t>(me)] = k;
      }
      if (me == held_in(k)) {
        // A bounded poll of the condition (not a sleep that stages it): 10 s at most.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!watch.all_stuck_but(me, k)) {
          if (std::chrono::steady_clock::now() > give_up) {
            ++holds_given_up;
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        held_entered[k] = ++clock;
      }
      gw::collective::barrier(comm);
      left[k][static_cast<std::size_t>(me)] = ++clock;
      std::lock_guard lock(watch.mutex);
      watch.left_round[static_cast<std::size_t>(me)] = k;
    }
  });
  REQUIRE(holds_given_up.load() == 0);
  for (int k = 1; k <= rounds; ++k)
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(k, r, held_in(k));
      REQUIRE(held_entered[k] > 0);
      REQUIRE(left[k][r] > held_entered[k]);
    }
}
