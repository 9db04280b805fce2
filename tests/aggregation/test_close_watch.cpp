// K of N's close watch (aggregation/detail/close_watch.hpp) on inproc threads: one set per step on every rank,
// at least N - b in, the slow ranks out without waiting for them, and a clear timeout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <gradwire/aggregation/detail/close_watch.hpp>
#include <gradwire/collective/async_engine.hpp>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/transport/inproc.hpp>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;
using namespace std::chrono_literals;
using watch_type = gw::aggregation::detail::close_watch<gw::transport::inproc>;

namespace {

// Catch2 v2 assertions are not thread-safe: rank threads check with this, and the failure
// reaches the test through run_inproc's rethrow.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

struct outcome {
  std::vector<int> in;
  bool self_in = false;
  bool marked_in = false;  // what mark_ready answered
};

// Every rank runs `steps` rounds; before marking ready, rank r waits as `delay(step, r)`
// says: a duration, or (when `after_round(step, r)`) until its own round has finished, which
// only a rank the step can close without may do. Returns outcomes[step][rank].
template <class Delay, class AfterRound>
std::vector<std::vector<outcome>> run_steps(int ranks, int backups, int steps, Delay delay, AfterRound after_round) {
  std::vector<std::vector<outcome>> out(static_cast<std::size_t>(steps), std::vector<outcome>(static_cast<std::size_t>(ranks)));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int r = t.rank();
    gw::collective::communicator comm(std::move(t), {.timeout = 30s});
    watch_type watch(ranks, backups);
    for (int s = 0; s < steps; ++s) {
      watch.open(static_cast<std::uint64_t>(s));
      gw::aggregation::detail::step_set set;
      struct round {
        watch_type* watch;
        gw::aggregation::detail::step_set* set;
        void operator()(gw::collective::communicator<gw::transport::inproc>& c) const { *set = watch->run(c); }
      };
      auto handle = comm.async().submit(round{&watch, &set});
      if (after_round(s, r)) {
        const auto give_up = gw::clock::now() + 20s;
        while (!handle.ready()) {
          expect(gw::clock::now() < give_up, "rank " + std::to_string(r) + " step " + std::to_string(s) +
                                                 ": the round waited for a rank the step could close without");
          std::this_thread::sleep_for(1ms);
        }
      } else {
        std::this_thread::sleep_for(delay(s, r));
      }
      auto& o = out[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
      o.marked_in = watch.mark_ready(static_cast<std::uint64_t>(s));
      handle.wait(comm.queued_collective_deadline());
      o.in = set.in;
      o.self_in = set.self_in;
    }
  });
  return out;
}

// What every step must satisfy, whatever the timing: one set on every rank, at least N - b
// ranks in it, and each rank's own view (mark_ready, self_in, membership) agreeing.
void check_agreement(const std::vector<std::vector<outcome>>& out, int ranks, int backups) {
  for (std::size_t s = 0; s < out.size(); ++s) {
    CAPTURE(s);
    const auto& first = out[s][0].in;
    REQUIRE(std::is_sorted(first.begin(), first.end()));
    REQUIRE(static_cast<int>(first.size()) >= ranks - backups);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      const outcome& o = out[s][static_cast<std::size_t>(r)];
      REQUIRE(o.in == first);
      REQUIRE(o.self_in == o.marked_in);
      REQUIRE(o.self_in == std::binary_search(first.begin(), first.end(), r));
    }
  }
}

}  // namespace

TEST_CASE("every rank of a K-of-N step holds the same set, of at least N - b ranks, whatever the timing") {
  const std::uint64_t seed = std::random_device{}();
  for (int ranks = 2; ranks <= 5; ++ranks) {
    for (int backups = 1; backups < ranks; ++backups) {
      CAPTURE(seed, ranks, backups);
      // Each rank's readiness a few hundred microseconds apart at random: announcements cross.
      auto delay = [&](int s, int r) {
        std::mt19937_64 gen(seed ^ (std::uint64_t(s) << 20) ^ std::uint64_t(r) << 8 ^ std::uint64_t(ranks));
        return std::chrono::microseconds(gen() % 2000);
      };
      const auto out = run_steps(ranks, backups, 20, delay, [](int, int) { return false; });
      check_agreement(out, ranks, backups);
    }
  }
}

TEST_CASE("the slowest b ranks are out of every step, and the round does not wait for them") {
  // Reference: the N - b ranks that mark ready at once are the set; the others mark ready
  // only after their own round has finished, which it can only do without them.
  for (int ranks : {2, 3, 4}) {
    for (int backups = 1; backups < ranks; ++backups) {
      CAPTURE(ranks, backups);
      const int fast = ranks - backups;
      auto slow = [&](int s, int r) { return (r + s) % ranks >= fast; };  // the slow ones move round
      const auto out = run_steps(ranks, backups, 6, [](int, int) { return std::chrono::microseconds(0); }, slow);
      check_agreement(out, ranks, backups);
      for (int s = 0; s < 6; ++s) {
        std::vector<int> expected;
        for (int r = 0; r < ranks; ++r)
          if (!slow(s, r)) expected.push_back(r);
        CAPTURE(s);
        REQUIRE(out[static_cast<std::size_t>(s)][0].in == expected);
        for (int r = 0; r < ranks; ++r) REQUIRE(out[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)].marked_in == !slow(s, r));
      }
    }
  }
}

TEST_CASE("a K-of-N step whose ranks never become ready times out naming the rank and what it heard") {
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    const int r = t.rank();
    gw::collective::communicator comm(std::move(t), {.timeout = 300ms});
    watch_type watch(3, 1);
    watch.open(0);
    const auto got = gw::testing::outcome_of([&] { watch.run(comm); });
    expect(got.kind == gw::errc::timeout, "kind: " + got.what);
    expect(got.what.find("close_watch: rank " + std::to_string(r) + " heard 0 of 2 peers") != std::string::npos &&
               got.what.find("2 of 3 ranks ready") != std::string::npos,
           got.what);
  });
}

TEST_CASE("a caller's readiness counts for the step it names: early for a round not yet open, never for one past") {
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    const int r = t.rank();
    gw::collective::communicator comm(std::move(t), {.timeout = 30s});
    watch_type watch(2, 1);
    // Rank 0 marks step 0 ready before its round opens: the round starts ready and announces.
    if (r == 0) expect(watch.mark_ready(0), "a step marked before its round opened counts as in");
    watch.open(0);
    const auto first = watch.run(comm);
    expect(first.in == std::vector<int>{0} && first.self_in == (r == 0), "step 0: rank 0 alone is in");
    // Rank 1's gradient of step 0 comes after the step closed: it is late, and stays out of step 1.
    if (r == 1) expect(!watch.mark_ready(0), "a step already run does not take a gradient");
    watch.open(1);
    if (r == 1) expect(!watch.mark_ready(0), "a gradient of a past step does not count for the open one");
    if (r == 0) expect(watch.mark_ready(1), "the open step takes its own gradient");
    const auto second = watch.run(comm);
    expect(second.in == std::vector<int>{0}, "step 1: rank 0 alone is in");
  });
}

TEST_CASE("a close watch refuses backups outside 1..N-1 and a communicator of another size") {
  for (auto [ranks, backups] : {std::pair{4, 0}, std::pair{4, 4}, std::pair{1, 1}}) {
    const auto [kind, what] = gw::testing::error_of([&] { watch_type(ranks, backups); });
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE_THAT(what, Catch::Contains("K of N needs 0 < backups < ranks"));
  }
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(std::move(t), {.timeout = 5s});
    watch_type watch(3, 1);
    const auto got = gw::testing::outcome_of([&] { watch.run(comm); });
    expect(got.kind == gw::errc::invalid_argument && got.what.find("made for 3 ranks, run on 2") != std::string::npos,
           got.what);
  });
}
