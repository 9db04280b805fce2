// The failure core (transport/detail/failure.hpp, peer_state.hpp, stall_watch.hpp): the kind and the words a rank
// reports for a peer's failure, for a loss a peer relays and for its own exception, what it knows of each peer, and
// when a waiting rank speaks up; every transport reports through it.
#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <gradwire/transport/detail/failure.hpp>
#include <gradwire/transport/detail/peer_state.hpp>
#include <gradwire/transport/detail/stall_watch.hpp>
#include <stdexcept>
#include <string>

namespace gw = gradwire;
using gw::errc;
namespace core = gw::transport::detail;

TEST_CASE("peer_failure_kind: a peer's mismatch, timeout or config error keeps its kind, anything else is a lost peer") {
  using core::peer_failure_kind;
  for (const errc kept : {errc::mismatch, errc::timeout, errc::config}) REQUIRE(peer_failure_kind(kept) == kept);
  for (const errc lost : {errc::peer_lost, errc::protocol, errc::auth, errc::invalid_argument, errc::device, errc{}})
    REQUIRE(peer_failure_kind(lost) == errc::peer_lost);
}

TEST_CASE("failure_of: a gradwire error keeps its kind and message, any other exception is a lost peer with what()") {
  const auto of = [](auto thrown) { return core::failure_of(std::make_exception_ptr(thrown)); };
  const core::rank_failure config = of(gw::error(errc::config, "the job's setting is bad"));
  CHECK(config.cause == errc::config);
  CHECK(config.reason == gw::error(errc::config, "the job's setting is bad").what());
  const core::rank_failure logic = of(std::logic_error("the real problem"));
  CHECK(logic.cause == errc::peer_lost);
  CHECK(logic.reason == "the real problem");
  const core::rank_failure other = of(42);
  CHECK(other.cause == errc::peer_lost);
  CHECK(other.reason == "unknown exception");
}

TEST_CASE("a peer's abort: its reason quoted under its kind's rule, and passed on as this rank's report") {
  for (const errc cause : {errc::config, errc::timeout, errc::mismatch, errc::protocol, errc::peer_lost}) {
    CAPTURE(cause);
    const auto f = core::peer_failure(2, 0, {cause, -1, "rank 0 failed: the job's setting is bad"}, false, false);
    CHECK(f.report.cause == core::peer_failure_kind(cause));
    CHECK(f.report.reason == "rank 2: rank 0 failed: rank 0 failed: the job's setting is bad");
    CHECK(f.pass_on.cause == f.report.cause);
    CHECK(f.pass_on.lost == -1);
    CHECK(f.pass_on.reason == f.report.reason);
  }
}

TEST_CASE("a loss a peer relays reads as this rank's own loss of that rank, and is passed on as that loss") {
  const std::string why = "its endpoint failed (Endpoint timeout; the process exited or was killed)";
  const auto f = core::peer_failure(2, 0, {errc::peer_lost, 1, why}, false, false);
  CHECK(f.report.cause == errc::peer_lost);
  CHECK(f.report.reason == "rank 2: lost rank 1: rank 0 reports: " + why);
  CHECK(f.pass_on.cause == errc::peer_lost);
  CHECK(f.pass_on.lost == 1);
  CHECK(f.pass_on.reason == "rank 0 reports: " + why);
}

TEST_CASE("a relayed loss of a rank this rank tolerates, or of this rank itself, is the relaying peer's failure") {
  const std::string why = "its connection closed (the process exited or was killed)";
  for (const bool tolerated : {true, false}) {
    CAPTURE(tolerated);
    const int lost = tolerated ? 1 : 2;  // untolerated: the loss relayed is this rank's own
    const auto f = core::peer_failure(2, 0, {errc::peer_lost, lost, why}, false, tolerated);
    CHECK(f.report.cause == errc::peer_lost);
    CHECK(f.report.reason == "rank 2: rank 0 failed: rank 0: lost rank " + std::to_string(lost) + ": " + why);
    CHECK(f.pass_on.lost == -1);
  }
  CHECK(core::abort_reason(0, {errc::peer_lost, 1, why}) == "rank 0: lost rank 1: " + why);
}

TEST_CASE("a tolerated peer is isolated, unless it relays the loss of a rank this rank does not tolerate") {
  const std::string why = "its connection closed (the process exited or was killed)";
  // A parameter server (rank 2) tolerates its workers (rank 0) but not the other server (rank 1).
  const auto relayed = core::peer_failure(2, 0, {errc::peer_lost, 1, why}, true, false);
  CHECK_FALSE(relayed.isolate_only);
  CHECK(relayed.report.reason == "rank 2: lost rank 1: rank 0 reports: " + why);
  CHECK(relayed.pass_on.lost == 1);
  const auto own = core::peer_failure(2, 0, {errc::config, -1, "bad"}, true, false);  // the worker's own failure
  CHECK(own.isolate_only);
  CHECK(own.report.cause == errc::peer_lost);
  CHECK(own.report.reason == "rank 2: lost rank 0: it failed: bad");
  const auto of_a_tolerated = core::peer_failure(2, 0, {errc::peer_lost, 3, why}, true, true);  // another worker
  CHECK(of_a_tolerated.isolate_only);
  CHECK(of_a_tolerated.report.reason == "rank 2: lost rank 0: it failed: rank 0: lost rank 3: " + why);
  CHECK(core::abort_reason(0, {errc::config, -1, "bad"}) == "bad");
}

TEST_CASE("the words of a failure: finished, lost, relayed, abandoned, tolerated, own") {
  CHECK(core::finished_message(0, 2) == "rank 0: rank 2 has finished (said goodbye) and will send nothing more");
  CHECK(core::finished_message(0, 2, "said goodbye at virtual time 1.5 s") ==
        "rank 0: rank 2 has finished (said goodbye at virtual time 1.5 s) and will send nothing more");
  CHECK(core::lost_peer_message(0, 2, "it died") == "rank 0: lost rank 2: it died");
  CHECK(core::relayed_loss_message(0, 2, 1, "it died") == "rank 0: lost rank 2: rank 1 reports: it died");
  CHECK(core::abandoned_by_message(0, "receive from rank 1 (tag 7, 64 bytes)", 2, "why") ==
        "rank 0: receive from rank 1 (tag 7, 64 bytes) abandoned: rank 2 failed: why");
  CHECK(core::tolerated_peer_failed_message(0, 2, "why") == "rank 0: lost rank 2: it failed: why");
  CHECK(core::peer_failed_message(0, 2, "why") == "rank 0: rank 2 failed: why");
  CHECK(core::rank_failed_message(0, "why") == "rank 0 failed: why");
}

TEST_CASE("a peer's state: a goodbye or a loss ends its grace, and only a peer neither finished nor lost is live") {
  core::peer_state s;
  CHECK(s.live());
  s.suspect(gw::clock::now(), "its connection closed", "rank 0: lost rank 1: its connection closed");
  CHECK(s.suspected());
  CHECK(s.live());  // suspected, not yet lost: its goodbye or its reason may still come
  core::peer_state finished = s;
  finished.say_goodbye();
  CHECK_FALSE(finished.suspected());
  CHECK(finished.finished);
  CHECK_FALSE(finished.live());
  CHECK_FALSE(finished.lost());
  s.lose(s.suspected_message);
  CHECK_FALSE(s.suspected());
  CHECK(s.lost());
  CHECK_FALSE(s.live());
  CHECK(s.lost_reason == "rank 0: lost rank 1: its connection closed");
  CHECK(s.suspected_reason == "its connection closed");  // what the rank relays when it fails from the loss
}

TEST_CASE("the stall watch tells the peers at 3/4 of its first word, warns once, and gives up from the stall timeout "
          "on") {
  using namespace std::chrono_literals;
  const gw::clock::time_point t0{};
  SECTION("warning only") {
    core::stall_watch w(60s, 0s);
    w.begin(t0);
    CHECK_FALSE(w.check(t0 + 44s).tell);
    CHECK(w.check(t0 + 45s).tell);
    CHECK_FALSE(w.check(t0 + 46s).tell);  // once per wait
    CHECK(w.told());
    CHECK_FALSE(w.check(t0 + 59s).warn);
    CHECK(w.check(t0 + 60s).warn);
    CHECK_FALSE(w.check(t0 + 61s).warn);
    CHECK_FALSE(w.check(t0 + 3600s).give_up);
    w.begin(t0 + 100s);  // a new wait starts over
    CHECK_FALSE(w.told());
    CHECK(w.check(t0 + 145s).tell);
  }
  SECTION("a stall timeout below the warning: told at 3/4 of it, no warning, given up at it and after") {
    core::stall_watch w(60s, 4s);
    w.begin(t0);
    CHECK_FALSE(w.check(t0 + 2999ms).tell);
    CHECK(w.check(t0 + 3s).tell);
    const auto at = w.check(t0 + 4s);
    CHECK(at.give_up);
    CHECK_FALSE(at.warn);
    CHECK(w.check(t0 + 5s).give_up);
    CHECK(w.waited(t0 + 5s) == 5s);
    CHECK(w.gave_up_text() == "(gave up after GRADWIRE_STALL_TIMEOUT=4 s)");
  }
  SECTION("a stall timeout above the warning: warned at the warning, given up at the timeout") {
    core::stall_watch w(2s, 10s);
    w.begin(t0);
    CHECK(w.check(t0 + 1500ms).tell);
    CHECK(w.check(t0 + 2s).warn);
    CHECK_FALSE(w.check(t0 + 9s).give_up);
    CHECK(w.check(t0 + 10s).give_up);
  }
  CHECK(core::stalled_message({1}, "(x)") == "rank 1 stalled (x)");
  CHECK(core::stalled_message({2, 3}, "(x)") == "ranks 2, 3 stalled (x)");
  CHECK(core::stalled_message({}, "(x)") == "no rank is stalled but the ranks wait for each other (x)");
}
