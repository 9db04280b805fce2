// transport::simulated: closed-form virtual times, determinism, every strategy's maths equal to inproc's, faults.
#include <catch2/catch.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/simulated.hpp>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/errors.hpp"

namespace gw = gradwire;
namespace sim = gradwire::simulation;
using gradwire::test::require_close;
using namespace std::chrono_literals;

namespace {

// 30 s on `t`'s virtual clock.
gw::deadline soon(const gw::transport::simulated& t) { return t.time().deadline_after(std::chrono::seconds(30)); }

double seconds(sim::time_point t) { return double(t.count()) / 1e9; }

void send(gw::transport::simulated& t, int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
  auto r = t.async_send(peer, tag, bytes);
  t.wait(r, soon(t));
}
void recv(gw::transport::simulated& t, int peer, std::uint64_t tag, std::span<std::byte> bytes) {
  auto r = t.async_recv(peer, tag, bytes);
  t.wait(r, soon(t));
}

// Ranks 0 and 1 exchange `bytes` back and forth `round_trips` times; returns the job's end.
sim::time_point ping_pong(const sim::cluster_model& m, int round_trips, std::size_t bytes) {
  return sim::run(m, [&](gw::transport::simulated t) {
           std::vector<std::byte> buf(bytes);
           for (int i = 0; i < round_trips; ++i) {
             if (t.rank() == 0) {
               send(t, 1, 1, buf);
               recv(t, 1, 2, buf);
             } else {
               recv(t, 0, 1, buf);
               send(t, 0, 2, buf);
             }
           }
         })
      .end;
}

}  // namespace

TEST_CASE("a simulated rank's time is virtual, and any_transport and the communicator hand out the same clock") {
  const auto m = sim::parse_cluster_model("hosts=2 compute=modelled");
  std::vector<std::int64_t> seen(2, -1);
  sim::run(m, [&](gw::transport::simulated t) {
    sim::compute(std::chrono::milliseconds(5 + 5 * t.rank()));
    const gw::deadline now = t.time().now();
    // 5 ms (rank 0) or 10 ms (rank 1) of modelled compute since the simulation began.
    REQUIRE(now.time_since_epoch() == std::chrono::milliseconds(5 + 5 * t.rank()));
    REQUIRE(gw::concepts::time_of(t).now() == now);
    gw::transport::any_transport any(std::move(t));
    REQUIRE(any.time().now() == now);
    gw::collective::communicator comm(std::move(any), {.timeout = 3s});
    REQUIRE(comm.time().now() == now);
    REQUIRE(comm.step_deadline() - now == 3s);
    // A wait with a virtual deadline times out in virtual time: 1 ms after it began.
    auto& tr = comm.transport();
    const int peer = 1 - comm.rank();
    {
      std::byte b[4];
      auto r = tr.async_recv(peer, 77, b);
      const gw::deadline began = comm.time().now();
      const auto [kind, what] = gw::testing::error_of([&] { tr.wait(r, comm.time().deadline_after(1ms)); });
      REQUIRE(kind == gw::errc::timeout);
      seen[static_cast<std::size_t>(comm.rank())] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(comm.time().now() - began).count();
    }
    // Neither leaves before the other has timed out (a goodbye would end the other's wait).
    std::byte mine[1]{}, theirs[1];
    auto send = tr.async_send(peer, 78, mine);
    auto recv = tr.async_recv(peer, 78, theirs);
    tr.wait(send, comm.time().deadline_after(30s));
    tr.wait(recv, comm.time().deadline_after(30s));
  });
  REQUIRE(seen == std::vector<std::int64_t>{1'000'000, 1'000'000});
}

TEST_CASE("the steady clock is the time of a transport that keeps none") {
  gw::transport::local t;
  const auto before = gw::clock::now();
  const auto now = gw::concepts::time_of(t).now();
  REQUIRE(now >= before);
  REQUIRE(now <= gw::clock::now());
  REQUIRE(!gw::concepts::time_of(t).runs_background_inline());
}

TEST_CASE("a straggler draw is Box-Muller jitter from two uniforms, and the tail's two more only when a tail is set") {
  // The draws are documented to be the same numbers on every platform from the same
  // generator state: computed again here from mt19937_64's outputs, step by step. A draw
  // that took a uniform it does not use would shift every later step's factor.
  const auto uniform = [](std::mt19937_64& g) { return (double(g() >> 11) + 0.5) / 9007199254740992.0; };
  for (const char* text : {"jitter=0.3 seed=5", "jitter=0.3 tail=0.25:1.5:4 seed=5", "tail=0.5:2 seed=5"}) {
    CAPTURE(text);
    const auto m = sim::parse_cluster_model(text);
    std::mt19937_64 drawn(11), reference(11);
    for (int step = 0; step < 200; ++step) {
      CAPTURE(step);
      double want = 1;
      if (m.stragglers.jitter > 0) {
        const double u1 = uniform(reference), u2 = uniform(reference);
        want *= std::exp(m.stragglers.jitter * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
      }
      if (m.stragglers.tail_probability > 0 && uniform(reference) < m.stragglers.tail_probability)
        want *= std::min(m.stragglers.tail_cap, std::pow(uniform(reference), -1 / m.stragglers.tail_alpha));
      REQUIRE(m.stragglers.draw(drawn) == Approx(want).epsilon(1e-12));
    }
    REQUIRE(drawn() == reference());  // both generators advanced alike
  }
}

TEST_CASE("a cluster model written with tabs and Windows line ends reads as the same model") {
  // A file aligned with tabs, saved with CRLF line ends: tabs and carriage returns separate
  // words as spaces do, and are never part of a key or a value.
  const auto plain = sim::parse_cluster_model("hosts=3 ranks_per_host=2 bandwidth=1Gbit latency=20us seed=9");
  const auto tabbed =
      sim::parse_cluster_model("hosts=3\tranks_per_host=2\r\nbandwidth=1Gbit\t# between hosts\r\nlatency=20us\tseed=9\r\n");
  CHECK(sim::describe(tabbed) == sim::describe(plain));
  CHECK(tabbed.size() == 6);
  CHECK(tabbed.network.latency == 20us);
  CHECK(tabbed.seed == 9);
}

TEST_CASE("cluster models parse from key=value text and refuse what they cannot mean") {
  const auto m = sim::parse_cluster_model(
      "hosts=3 ranks_per_host=2, bandwidth=1Gbit latency=50us  # a comment\n local_bandwidth=10GB local_latency=2us "
      "overhead=1us compute=modelled speed=2 slow=1:3 jitter=0.1 tail=0.02:1.5:10 die=4@1.5s seed=7");
  CHECK(m.size() == 6);
  CHECK(m.host(3) == 1);
  CHECK(m.network.bandwidth == 125e6);
  CHECK(m.network.latency == 50us);
  CHECK(m.local.bandwidth == 10e9);
  CHECK(m.overhead == 1us);
  CHECK(m.compute == sim::compute_model::modelled);
  CHECK(m.stragglers.fixed_factor(1) == 3);
  CHECK(m.stragglers.tail_cap == 10);
  REQUIRE(m.deaths.size() == 1);
  CHECK(m.deaths[0].at == 1500ms);
  CHECK(m.topology().host(5) == 2);
  // What describe() prints reads back as the same model.
  const auto again = sim::parse_cluster_model(sim::describe(m));
  CHECK(again.size() == m.size());
  CHECK(again.network.latency == m.network.latency);
  CHECK(again.stragglers.tail_alpha == m.stragglers.tail_alpha);

  // What a key left out means, as the header documents it: 1 x 1 ranks, 1Gbit and 50us
  // between hosts, 10GB and 2us within one, no overhead, measured compute at speed 1,
  // stragglers' tail capped at 20, seed 1.
  const auto four = sim::parse_cluster_model("ranks_per_host=4");
  CHECK(four.hosts == 1);
  CHECK(four.size() == 4);
  const auto two = sim::parse_cluster_model("hosts=2 tail=0.1:2");
  CHECK(two.ranks_per_host == 1);
  CHECK(two.size() == 2);
  CHECK(two.network.bandwidth == 125e6);
  CHECK(two.network.latency == 50us);
  CHECK(two.local.bandwidth == 10e9);
  CHECK(two.local.latency == 2us);
  CHECK(two.overhead == 0us);
  CHECK(two.compute == sim::compute_model::measured);
  CHECK(two.speed == 1);
  CHECK(two.stragglers.tail_cap == 20);
  CHECK(two.seed == 1);

  auto config_error = [](const char* text, const char* says) {
    CAPTURE(text);
    REQUIRE_THROWS_MATCHES(sim::parse_cluster_model(text), gw::error,
                           Catch::Predicate<gw::error>([&](const gw::error& e) {
                             return e.kind() == gw::errc::config && std::string(e.what()).find(says) != std::string::npos;
                           }));
  };
  config_error("hosts=0", "hosts and ranks_per_host");
  config_error("bandwidth=fast", "bandwidth=fast");
  config_error("latency=5 parsecs", "parsecs");
  config_error("colour=blue", "unknown key 'colour'");
  config_error("slow=9:2", "slow=9");
  config_error("die=1", "RANK@TIME");
  config_error("hosts", "not key=value");
  config_error("hosts=65536 ranks_per_host=65536", "at most 100000 ranks");
  config_error("speed=inf", "speed=inf");
  config_error("jitter=nan", "jitter=nan");
  config_error("bandwidth=infGB", "finite rate");
  config_error("latency=1e300s", "0 to 100 years");
  // The tail's cap is a slowdown factor: below 1 it would speed a straggler up.
  config_error("tail=0.1:1.5:0.5", "cap >= 1");
  config_error("tail=0.1:1.5:0", "cap >= 1");
  CHECK(sim::parse_cluster_model("tail=0.1:1.5:1").stragglers.tail_cap == 1);  // no slowdown at all: allowed
  REQUIRE_THROWS_AS(sim::compute(-5ms), gw::error);
}

TEST_CASE("virtual times of simple patterns equal their closed forms") {
  SECTION("ping-pong: 2k messages of latency + n / bandwidth each") {
    const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us compute=modelled");
    const std::size_t n = 1'000'000;
    const int round_trips = 10;
    CHECK(seconds(ping_pong(m, round_trips, n)) == Approx(2 * round_trips * (10e-6 + double(n) / 1e9)).epsilon(1e-9));
  }

  SECTION("ring all-reduce: 2(N-1) steps of latency + (n/N) / bandwidth") {
    for (int ranks : {2, 3, 5}) {
      CAPTURE(ranks);
      const auto m = sim::parse_cluster_model("hosts=" + std::to_string(ranks) +
                                              " bandwidth=1GB latency=10us compute=modelled");
      const std::size_t elements = 3 * 5 * 4096;  // divisible by every N here
      double checked = 0;
      const auto report = sim::run(m, [&](gw::transport::simulated t) {
        gw::collective::communicator<gw::transport::simulated> comm(std::move(t));
        std::vector<float> x(elements, float(comm.rank() + 1));
        gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(x));
        if (comm.rank() == 0) checked = x[0];
      });
      CHECK(checked == ranks * (ranks + 1) / 2);
      const double step = 10e-6 + double(elements * sizeof(float)) / ranks / 1e9;
      // The call check rides beside the first data: a few bytes more in the first step
      // (under 500 B: half a microsecond; one step more or less would be 10 us or more).
      CHECK(seconds(report.end) == Approx(2 * (ranks - 1) * step).epsilon(0).margin(0.5e-6));
    }
  }

  SECTION("two flows into one host share its link: the second arrives n / bandwidth after the first") {
    const auto m = sim::parse_cluster_model("hosts=3 bandwidth=1GB latency=10us compute=modelled");
    const std::size_t n = 4'000'000;
    std::vector<double> arrived(2);
    sim::run(m, [&](gw::transport::simulated t) {
      std::vector<std::byte> buf(n);
      if (t.rank() == 0) {
        auto a = t.async_recv(1, 1, buf);
        std::vector<std::byte> other(n);
        auto b = t.async_recv(2, 1, other);
        gw::transport::simulated::request* both[] = {&a, &b};
        const std::size_t first = t.wait_any(both, soon(t));
        arrived[0] = seconds(t.now());
        t.wait(*both[first], soon(t));
        t.wait(*both[1 - first], soon(t));
        arrived[1] = seconds(t.now());
      } else {
        send(t, 0, 1, buf);
      }
    });
    CHECK(arrived[0] == Approx(10e-6 + 4e-3).epsilon(1e-9));
    CHECK(arrived[1] == Approx(10e-6 + 8e-3).epsilon(1e-9));
  }

  SECTION("two flows out of one host share its link; to ranks of its own host they take the local link") {
    const auto m = sim::parse_cluster_model(
        "hosts=2 ranks_per_host=2 bandwidth=1GB latency=10us local_bandwidth=4GB local_latency=1us compute=modelled");
    const std::size_t n = 4'000'000;
    std::vector<double> done(4);
    sim::run(m, [&](gw::transport::simulated t) {
      std::vector<std::byte> buf(n);
      if (t.rank() == 0) {  // host 0 -> ranks 2 and 3 of host 1, and to rank 1 beside it
        auto a = t.async_send(2, 1, buf);
        auto b = t.async_send(3, 1, buf);
        auto c = t.async_send(1, 1, buf);
        t.wait(a, soon(t));
        t.wait(b, soon(t));
        t.wait(c, soon(t));
      } else {
        recv(t, 0, 1, buf);
        done[static_cast<std::size_t>(t.rank())] = seconds(t.now());
      }
    });
    CHECK(done[2] == Approx(10e-6 + 4e-3).epsilon(1e-9));
    CHECK(done[3] == Approx(10e-6 + 8e-3).epsilon(1e-9));
    CHECK(done[1] == Approx(1e-6 + 1e-3).epsilon(1e-9));
  }

  SECTION("modelled compute, speed and a slow rank: the step waits for the slowest") {
    const auto m = sim::parse_cluster_model("hosts=3 bandwidth=1GB latency=0us compute=modelled speed=2 slow=2:3");
    const auto report = sim::run(m, [&](gw::transport::simulated t) {
      gw::collective::communicator<gw::transport::simulated> comm(std::move(t));
      sim::compute(10ms);
      gw::collective::barrier(comm);
    });
    // Rank 2 computes 10 ms x 2 x 3; the barrier's messages are a few bytes.
    CHECK(seconds(report.end) == Approx(0.060).epsilon(1e-4));
    CHECK(report.rank_end[0] >= 60ms);
  }

  SECTION("measured compute counts the CPU time a rank spends, times its speed") {
    const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1GB latency=0us compute=measured speed=10");
    sim::time_point before_spin{}, after_spin{};
    double cpu_seconds = 0;
    auto thread_cpu = [] {
      timespec ts{};
      ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
    };
    sim::run(m, [&](gw::transport::simulated t) {
      std::byte b[1];
      if (t.rank() == 0) {
        before_spin = t.now();
        const double cpu_begin = thread_cpu();
        volatile double x = 0;
        while (thread_cpu() - cpu_begin < 0.02) x = x + 1;  // 20 ms of this thread's CPU
        cpu_seconds = thread_cpu() - cpu_begin;
        send(t, 1, 1, b);
        after_spin = t.now();
      } else {
        recv(t, 0, 1, b);
      }
    });
    // The spin's CPU time x 10, plus the little CPU the calls around it took.
    CHECK(seconds(after_spin - before_spin) >= 10 * cpu_seconds);
    CHECK(seconds(after_spin - before_spin) <= 10 * cpu_seconds + 0.005);
  }

  SECTION("thousands of messages (links forget old reservations) keep the closed form") {
    const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us compute=modelled");
    const int round_trips = 6000;  // 12,000 messages: pruned every 4,096
    CHECK(seconds(ping_pong(m, round_trips, 1000)) == Approx(2 * round_trips * (10e-6 + 1000 / 1e9)).epsilon(1e-9));
  }
}

// transport/detail/failure.hpp's rule, as over tcp and ucx (isolate): a tolerated peer's
// failure fails only the operations with it, and as a lost peer whatever its own kind; the
// rank goes on.
TEST_CASE("a tolerated peer that fails with a config error fails the operations with it as a lost peer, and the rank "
          "goes on") {
  const auto m = sim::parse_cluster_model("hosts=2 compute=modelled");
  sim::job job(m);
  std::optional<std::pair<gw::errc, std::string>> heard;
  bool went_on = false;
  const auto outcomes = job.run([&](gw::transport::simulated t) {
    if (t.rank() == 1) throw gw::error(gw::errc::config, "the job's setting is bad");
    t.tolerate_loss(1);
    std::byte b[4];
    auto r = t.async_recv(1, 9, b);
    try {
      t.wait(r, t.time().deadline_after(2s));
    } catch (const gw::error& e) {
      heard.emplace(e.kind(), e.what());
    }
    went_on = true;
  });
  REQUIRE(heard.has_value());
  CHECK(heard->first == gw::errc::peer_lost);
  CHECK_THAT(heard->second, Catch::Contains("rank 0: lost rank 1: it failed: ") &&
                                Catch::Contains("the job's setting is bad"));
  CHECK(went_on);
  CHECK_FALSE(outcomes[0]);
  CHECK(outcomes[1]);
}

TEST_CASE("a receive nobody sends times out in virtual time, and a job where every rank waits forever is a deadlock") {
  const auto m = sim::parse_cluster_model("hosts=2 compute=modelled");
  sim::time_point timed_out_at{};
  REQUIRE_THROWS_MATCHES(sim::run(m,
                                  [&](gw::transport::simulated t) {
                                    std::byte b[4];
                                    if (t.rank() == 1) return;
                                    auto r = t.async_recv(1, 9, b);
                                    try {
                                      t.wait(r, t.time().deadline_after(2s));
                                    } catch (...) {
                                      timed_out_at = t.now();
                                      throw;
                                    }
                                  }),
                         gw::error, Catch::Predicate<gw::error>([](const gw::error& e) {
                           // Rank 1 returned: its endpoint closed, so the receive fails
                           // as a lost peer at once instead of waiting for the deadline.
                           return e.kind() == gw::errc::peer_lost &&
                                  std::string(e.what()).find("rank 0: rank 1 has finished (said goodbye at virtual "
                                                             "time") != std::string::npos;
                         }));
  CHECK(timed_out_at < 1ms);

  REQUIRE_THROWS_MATCHES(sim::run(m,
                                  [&](gw::transport::simulated t) {
                                    std::byte b[4];
                                    auto r = t.async_recv(1 - t.rank(), 9, b);
                                    t.wait(r, t.time().deadline_after(2s));
                                  }),
                         gw::error, Catch::Predicate<gw::error>([](const gw::error& e) {
                           return e.kind() == gw::errc::timeout &&
                                  std::string(e.what()).find("virtual time 2.000000 s") != std::string::npos;
                         }));

  REQUIRE_THROWS_MATCHES(sim::run(m,
                                  [&](gw::transport::simulated t) {
                                    std::byte b[4];
                                    auto r = t.async_recv(1 - t.rank(), 9, b);
                                    t.wait(r, gw::deadline::max());
                                  }),
                         gw::error, Catch::Predicate<gw::error>([](const gw::error& e) {
                           return e.kind() == gw::errc::timeout && std::string(e.what()).find("deadlocked") != std::string::npos;
                         }));

  // Deadlines count virtual time only: a peer that spends real CPU time before it sends
  // within the deadline (in virtual time) is waited for.
  const auto measured = sim::parse_cluster_model("hosts=2 compute=modelled latency=10us");
  sim::run(measured, [&](gw::transport::simulated t) {
    std::byte b[4]{};
    if (t.rank() == 0) {
      const auto until = t.time().deadline_after(10ms);
      auto r = t.async_recv(1, 9, b);
      t.wait(r, until);
      CHECK(t.now() == 5ms + 10us + 32ns);  // 4 B at 1 Gbit/s: 32 ns
    } else {
      const auto begin = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - begin < 100ms) {
      }  // real time, no virtual time (compute=modelled)
      sim::compute(5ms);
      send(t, 0, 9, b);
    }
  });

  // A receive that timed out took nothing: posted again, it gets the message.
  sim::run(m, [&](gw::transport::simulated t) {
    std::uint32_t word = 0;
    auto bytes = std::as_writable_bytes(std::span(&word, 1));
    if (t.rank() == 0) {
      auto r = t.async_recv(1, 9, bytes);
      REQUIRE_THROWS_AS(t.wait(r, t.time().deadline_after(1ms)), gw::error);
      auto again = t.async_recv(1, 9, bytes);
      t.wait(again, t.time().deadline_after(1s));
      CHECK(word == 7);
    } else {
      sim::compute(5ms);
      word = 7;
      send(t, 0, 9, bytes);
    }
  });

  // A job runs once; an empty wait_any is a timeout, not a hang.
  sim::job once(m);
  once.run([](gw::transport::simulated t) {
    std::vector<gw::transport::simulated::request*> none(2, nullptr);
    const auto [kind, what] = gw::testing::error_of([&] { t.wait_any(none, t.time().deadline_after(1ms)); });
    REQUIRE(kind == gw::errc::timeout);
    REQUIRE_THAT(what, Catch::Contains(": nothing did not complete before its deadline"));  // names what it waited for, even nothing
  });
  REQUIRE_THROWS_AS(once.run([](gw::transport::simulated) {}), gw::error);
}

TEST_CASE("a dropped receive gives its message to the next one, and a size mismatch fails the receiver as a mismatch") {
  const auto m = sim::parse_cluster_model("hosts=2 compute=modelled latency=10us");
  sim::run(m, [&](gw::transport::simulated t) {
    std::uint32_t word = 0;
    auto bytes = std::as_writable_bytes(std::span(&word, 1));
    if (t.rank() == 0) {
      { auto dropped = t.async_recv(1, 9, bytes); }
      auto r = t.async_recv(1, 9, bytes);
      t.wait(r, t.time().deadline_after(1s));
      CHECK(word == 42);
    } else {
      sim::compute(1ms);
      word = 42;
      send(t, 0, 9, bytes);
    }
  });
  REQUIRE_THROWS_MATCHES(sim::run(m,
                                  [&](gw::transport::simulated t) {
                                    std::vector<std::byte> b(t.rank() == 0 ? 8 : 4);
                                    if (t.rank() == 0) recv(t, 1, 9, b);
                                    else send(t, 0, 9, b);
                                  }),
                         gw::error, Catch::Predicate<gw::error>([](const gw::error& e) {
                           return e.kind() == gw::errc::mismatch && std::string(e.what()).find("sent 4 bytes") != std::string::npos;
                         }));
}

TEST_CASE("wait_any returns requests in virtual arrival order, not in rank order") {
  const auto m = sim::parse_cluster_model("hosts=5 bandwidth=1GB latency=10us compute=modelled");
  std::vector<int> order;
  sim::run(m, [&](gw::transport::simulated t) {
    std::uint32_t word = 0;
    auto bytes = std::as_writable_bytes(std::span(&word, 1));
    if (t.rank() == 0) {
      std::vector<std::uint32_t> words(4);
      std::vector<gw::transport::simulated::request> rs;
      for (int p = 1; p <= 4; ++p) rs.push_back(t.async_recv(p, 1, std::as_writable_bytes(std::span(&words[p - 1], 1))));
      std::vector<gw::transport::simulated::request*> ptrs;
      for (auto& r : rs) ptrs.push_back(&r);
      for (int k = 0; k < 4; ++k) {
        const std::size_t i = t.wait_any(ptrs, soon(t));
        t.wait(*ptrs[i], soon(t));
        ptrs[i] = nullptr;
        order.push_back(int(words[i]));
      }
    } else {
      sim::compute(std::chrono::milliseconds(10 * ((t.rank() * 3) % 5)));  // ranks 1..4: 30, 10, 40, 20 ms
      word = std::uint32_t(t.rank());
      send(t, 0, 1, bytes);
    }
  });
  CHECK(order == std::vector<int>{2, 4, 1, 3});
}

TEST_CASE("a message fills an idle gap of a link only when it fits there, else it goes after the reservation that ends the gap") {
  // 1 GB/s: one byte is one nanosecond on a link. Rank 1 posts Y (1 MB, to rank 0) and then
  // P (1 kB, to rank 2) at 0: P waits for Y on host 1's egress, enters it at 1,000,000 ns
  // and holds host 2's ingress one latency later, over [1,010,000, 1,011,000) ns. Rank 0
  // computes 100 us and sends Q (q bytes, to rank 2) later in virtual time but with an
  // earlier start on host 2's ingress (110,000 ns): the gap before P is 900,000 ns, so Q of
  // up to 900,000 bytes goes in it, and a longer one after P (a link carries one message
  // at a time).
  const auto m = sim::parse_cluster_model("hosts=3 bandwidth=1GB latency=10us compute=modelled");
  const std::int64_t y = 1'000'000, p = 1'000, latency = 10'000, q_sent = 100'000;
  const std::int64_t gap_begin = q_sent + latency, gap_end = y + latency, p_arrives = gap_end + p;
  REQUIRE(gap_end - gap_begin == 900'000);
  for (const std::int64_t q : {std::int64_t{1'000}, std::int64_t{900'000}, std::int64_t{900'001}, std::int64_t{2'000'000}}) {
    CAPTURE(q);
    // By hand: in the gap from its earliest start, or after P.
    const std::int64_t q_arrives = q <= gap_end - gap_begin ? gap_begin + q : p_arrives + q;
    std::int64_t got_q = -1, got_p = -1;
    sim::run(m, [&](gw::transport::simulated t) {
      if (t.rank() == 0) {
        std::vector<std::byte> out(static_cast<std::size_t>(q)), in(static_cast<std::size_t>(y));
        sim::compute(std::chrono::nanoseconds(q_sent));
        send(t, 2, 1, out);
        recv(t, 1, 1, in);
      } else if (t.rank() == 1) {
        std::vector<std::byte> big(static_cast<std::size_t>(y)), small(static_cast<std::size_t>(p));
        auto a = t.async_send(0, 1, big);
        auto b = t.async_send(2, 1, small);
        t.wait(a, soon(t));
        t.wait(b, soon(t));
      } else {
        std::vector<std::byte> from0(static_cast<std::size_t>(q)), from1(static_cast<std::size_t>(p));
        auto a = t.async_recv(0, 1, from0);
        auto b = t.async_recv(1, 1, from1);
        gw::transport::simulated::request* both[] = {&a, &b};
        const std::size_t first = t.wait_any(both, soon(t));
        t.wait(*both[first], soon(t));
        (first == 0 ? got_q : got_p) = t.now().count();
        t.wait(*both[1 - first], soon(t));
        (first == 0 ? got_p : got_q) = t.now().count();
      }
    });
    CHECK(got_p == p_arrives);  // 1,011,000 ns: P keeps its place whatever Q does
    CHECK(got_q == q_arrives);  // 111,000, 1,010,000, then 1,911,001 and 3,011,000 ns
  }
}

namespace {

// The incremental-step test's model: tensors of several sizes, a gradient linear in the
// parameters, a float64 reference of synchronous SGD on the mean gradient.
const std::vector<std::size_t> sizes{37, 0, 1, 300, 5, 1024, 3};

double shift(int rank, int step, std::size_t tensor, std::size_t j) {
  return std::sin(0.37 * double(j) + 1.3 * double(tensor) + 0.71 * rank + 0.19 * step);
}
double slope(int rank) { return 0.5 + 0.25 * rank; }

std::vector<gw::host_tensor<float>> make_params() {
  std::vector<gw::host_tensor<float>> out;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    out.emplace_back(gw::shape{sizes[t]});
    for (std::size_t j = 0; j < sizes[t]; ++j) out.back().data()[j] = float(0.1 * std::cos(double(j + t)));
  }
  return out;
}

using params_t = std::vector<std::vector<float>>;

// `workers` workers' synchronous SGD on the mean gradient, in float64.
std::vector<std::vector<double>> reference(int workers, int steps, double lr) {
  std::vector<std::vector<double>> p;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    p.emplace_back(sizes[t]);
    for (std::size_t j = 0; j < sizes[t]; ++j) p[t][j] = double(float(0.1 * std::cos(double(j + t))));
  }
  for (int k = 0; k < steps; ++k)
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::vector<double> mean(sizes[t], 0.0);
      for (int r = 0; r < workers; ++r)
        for (std::size_t j = 0; j < sizes[t]; ++j) mean[j] += (slope(r) * p[t][j] + shift(r, k, t, j)) / workers;
      for (std::size_t j = 0; j < sizes[t]; ++j) p[t][j] -= lr * mean[j];
    }
  return p;
}

// Trains `steps` steps on every rank the transport `each_rank` runs; returns every
// worker's final parameters (servers' entries stay empty).
template <class Strategy, class Transport>
void train_rank(Transport t, int steps, double lr, typename Strategy::aggregation_type aggregation,
                std::vector<params_t>& out) {
  const int rank = t.rank();
  Strategy s(std::move(t), make_params(), gw::optim::sgd({.lr = lr}), aggregation, {.timeout = std::chrono::seconds(60)});
  if (s.is_server()) {
    if constexpr (requires { s.serve(); }) s.serve();
    return;
  }
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<float>> grads;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const float* p = s.parameters()[i].data();
      grads.emplace_back(sizes[i]);
      for (std::size_t j = 0; j < sizes[i]; ++j) grads[i][j] = float(slope(rank) * double(p[j]) + shift(rank, k, i, j));
    }
    sim::compute(std::chrono::milliseconds(1 + rank % 3));
    std::vector<std::span<const float>> views(grads.begin(), grads.end());
    s.step(views);
  }
  params_t mine;
  for (auto& p : s.parameters()) mine.emplace_back(p.data(), p.data() + p.size());
  out[static_cast<std::size_t>(rank)] = std::move(mine);
}

template <class A, class Transport>
using strategy_of = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, A, Transport>;

template <class A>
std::vector<params_t> on_inproc(int ranks, int steps, double lr, A aggregation) {
  std::vector<params_t> out(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    train_rank<strategy_of<A, gw::transport::inproc>>(std::move(t), steps, lr, aggregation, out);
  });
  return out;
}

template <class A>
std::vector<params_t> on_simulated(const sim::cluster_model& m, int steps, double lr, A aggregation) {
  std::vector<params_t> out(static_cast<std::size_t>(m.size()));
  sim::run(m, [&](gw::transport::simulated t) {
    train_rank<strategy_of<A, gw::transport::simulated>>(std::move(t), steps, lr, aggregation, out);
  });
  return out;
}

}  // namespace

TEST_CASE("every strategy computes on the simulated transport what it computes on inproc: time changes, not maths") {
  constexpr double lr = 0.05;
  constexpr int steps = 4;
  namespace agg = gw::aggregation;
  const auto one_host = sim::parse_cluster_model("hosts=1 ranks_per_host=4 compute=modelled jitter=0.3 seed=3");
  const auto two_hosts = sim::parse_cluster_model("hosts=2 ranks_per_host=2 bandwidth=1Gbit compute=modelled jitter=0.3");
  const auto want = reference(4, steps, lr);

  SECTION("all_reduce (bucketed, async engine), central, averaging<1>: bit-identical to inproc on one host") {
    auto check = [&](auto aggregation) {
      const auto a = on_inproc(4, steps, lr, aggregation);
      const auto b = on_simulated(one_host, steps, lr, aggregation);
      for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK(a[static_cast<std::size_t>(r)] == b[static_cast<std::size_t>(r)]);
        require_close(b[static_cast<std::size_t>(r)], want);
      }
    };
    check(agg::all_reduce{});
    check(agg::all_reduce(512));
    check(agg::central(2));
    check(agg::averaging<1>{});
  }
  SECTION("all_reduce across two modelled hosts (hierarchical where auto picks it) matches the reference") {
    for (const auto& r : on_simulated(two_hosts, steps, lr, agg::all_reduce{})) require_close(r, want);
  }
  SECTION("parameter server, sync, on 3 workers and 1 server matches the reference") {
    gw::ps::options o;
    o.servers = 1;
    const auto got = on_simulated(two_hosts, steps, lr, agg::parameter_server<gw::ps::sync>(o));
    const auto want3 = reference(3, steps, lr);
    for (int r = 0; r < 3; ++r) require_close(got[static_cast<std::size_t>(r)], want3);
    CHECK(got[3].empty());
  }
  SECTION("parameter server, async and bounded staleness, one worker: bit-identical to inproc") {
    // With several workers the order gradients arrive in is the maths of an async server,
    // and arrival order is what a transport changes; with one worker there is one order.
    gw::ps::options o;
    o.servers = 1;
    const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1Gbit compute=modelled jitter=0.3");
    const auto a = on_inproc(2, steps, lr, agg::parameter_server<gw::ps::async>(o));
    const auto b = on_simulated(m, steps, lr, agg::parameter_server<gw::ps::async>(o));
    CHECK(a[0] == b[0]);
    require_close(b[0], reference(1, steps, lr));
    const auto c = on_inproc(2, steps, lr, agg::parameter_server<gw::ps::bounded_staleness<1>>(o));
    const auto d = on_simulated(m, steps, lr, agg::parameter_server<gw::ps::bounded_staleness<1>>(o));
    CHECK(c[0] == d[0]);
  }
}

TEST_CASE("two runs with the same seed give identical traces and parameters, and another seed does not") {
  namespace agg = gw::aggregation;
  auto& timeline = gw::observe::timeline::global();
  const auto path = std::filesystem::temp_directory_path() / "gradwire_test_simulation_timeline.json";
  timeline.start(path);
  gw::ps::options o;
  o.servers = 1;
  auto run_once = [&](const char* cluster) {
    timeline.write();  // forget earlier events
    const auto m = sim::parse_cluster_model(cluster);
    const auto params = on_simulated(m, 6, 0.05, agg::parameter_server<gw::ps::async>(o));
    std::vector<std::tuple<std::string, int, int, std::int64_t, std::int64_t, std::uint64_t>> events;
    for (const auto& e : timeline.events()) events.emplace_back(e.name, e.rank, e.track, e.begin_ns, e.duration_ns, e.bytes);
    return std::pair{params, events};
  };
  const char* model = "hosts=5 bandwidth=1Gbit latency=20us compute=modelled jitter=0.4 tail=0.2:1.5 seed=11";
  const auto [params_a, events_a] = run_once(model);
  const auto [params_b, events_b] = run_once(model);
  const auto [params_c, events_c] = run_once("hosts=5 bandwidth=1Gbit latency=20us compute=modelled jitter=0.4 tail=0.2:1.5 seed=12");
  timeline.stop();
  timeline.write();
  std::filesystem::remove(path);
  REQUIRE(events_a.size() > 50);
  CHECK(events_a == events_b);
  CHECK(params_a == params_b);
  // Virtual time: the first event begins near zero, not at the Unix time of today.
  CHECK(std::get<3>(events_a.front()) < std::int64_t(1e9));
  CHECK(events_a != events_c);  // async: arrival order, so the maths, follows the stragglers
  CHECK(params_a != params_c);
}

TEST_CASE("a bucketed all-reduce job (collectives on the background clock) is reproducible to the nanosecond") {
  namespace agg = gw::aggregation;
  const auto m = sim::parse_cluster_model("hosts=2 ranks_per_host=2 bandwidth=1Gbit compute=modelled jitter=0.3 tail=0.2:1.5");
  auto once = [&] {
    std::vector<params_t> out(4);
    std::vector<sim::time_point> ends;
    sim::job job(m);
    sim::run_report report;
    job.run(
        [&](gw::transport::simulated t) {
          train_rank<strategy_of<agg::all_reduce, gw::transport::simulated>>(std::move(t), 5, 0.05, agg::all_reduce(512),
                                                                               out);
        },
        &report);
    return std::pair{out, report.rank_end};
  };
  const auto [params_a, ends_a] = once();
  const auto [params_b, ends_b] = once();
  CHECK(params_a == params_b);
  CHECK(ends_a == ends_b);
  // Each step computes 1-3 ms x its straggler draw: the clocks moved.
  CHECK(ends_a[0] > 5ms);
}

TEST_CASE("a rank that dies at virtual time t is a lost peer to the others, as on a real transport") {
  namespace agg = gw::aggregation;
  SECTION("synchronous all-reduce: every survivor fails with peer_lost naming the rank, after t") {
    const auto m = sim::parse_cluster_model("hosts=4 bandwidth=1Gbit latency=50us compute=modelled die=2@25ms");
    std::vector<std::string> errors(4);
    std::vector<sim::time_point> when(4);
    sim::job job(m);
    sim::run_report report;
    const auto outcomes = job.run(
        [&](gw::transport::simulated t) {
          const int r = t.rank();
          gw::collective::communicator<gw::transport::simulated> comm(std::move(t));
          std::vector<float> x(1000, 1.0f);
          try {
            for (int k = 0; k < 100; ++k) {
              sim::compute(1ms);
              gw::collective::all_reduce(comm, std::span<float>(x));
            }
          } catch (const gw::error& e) {
            errors[static_cast<std::size_t>(r)] = e.what();
            when[static_cast<std::size_t>(r)] = sim::now();
            throw;
          }
        },
        &report);
    CHECK(report.died == std::vector<int>{2});
    CHECK(!outcomes[2]);
    for (int r : {0, 1, 3}) {
      CAPTURE(r, errors[static_cast<std::size_t>(r)]);
      REQUIRE(outcomes[static_cast<std::size_t>(r)]);
      CHECK(errors[static_cast<std::size_t>(r)].find("rank 2") != std::string::npos);
      CHECK(when[static_cast<std::size_t>(r)] >= 25ms + 50us);
      CHECK(when[static_cast<std::size_t>(r)] < 40ms);
    }
  }
  SECTION("asynchronous parameter server: the servers drop the dead worker and training goes on") {
    gw::ps::options o;
    o.servers = 1;
    const auto m = sim::parse_cluster_model("hosts=4 bandwidth=1Gbit latency=50us compute=modelled die=1@2ms");
    std::vector<params_t> out(4);
    std::vector<int> lost;
    std::vector<int> steps_done(4, 0);
    sim::run_report report = sim::run(m, [&](gw::transport::simulated t) {
      using S = strategy_of<agg::parameter_server<gw::ps::async>, gw::transport::simulated>;
      const int rank = t.rank();
      S s(std::move(t), make_params(), gw::optim::sgd({.lr = 0.01}), agg::parameter_server<gw::ps::async>(o));
      if (s.is_server()) {
        const auto stats = s.serve();
        lost = stats.lost_workers;
        return;
      }
      for (int k = 0; k < 10; ++k) {
        std::vector<std::vector<float>> grads;
        for (std::size_t i = 0; i < sizes.size(); ++i) grads.emplace_back(sizes[i], 0.01f * float(rank + 1));
        sim::compute(1ms);
        std::vector<std::span<const float>> views(grads.begin(), grads.end());
        s.step(views);
        ++steps_done[static_cast<std::size_t>(rank)];
      }
    });
    CHECK(report.died == std::vector<int>{1});
    CHECK(lost == std::vector<int>{1});
    CHECK(steps_done[0] == 10);
    CHECK(steps_done[2] == 10);
  }
  SECTION("a worker that throws is a lost peer to an async server, which drops it") {
    gw::ps::options o;
    o.servers = 1;
    const auto m = sim::parse_cluster_model("hosts=4 bandwidth=1Gbit latency=50us compute=modelled");
    std::vector<int> lost;
    sim::job job(m);
    const auto outcomes = job.run([&](gw::transport::simulated t) {
      using S = strategy_of<agg::parameter_server<gw::ps::async>, gw::transport::simulated>;
      const int rank = t.rank();
      S s(std::move(t), make_params(), gw::optim::sgd({.lr = 0.01}), agg::parameter_server<gw::ps::async>(o));
      if (s.is_server()) {
        lost = s.serve().lost_workers;
        return;
      }
      for (int k = 0; k < 5; ++k) {
        if (rank == 1 && k == 2) throw gw::error(gw::errc::invalid_argument, "worker 1 gives up");
        std::vector<std::vector<float>> grads;
        for (std::size_t i = 0; i < sizes.size(); ++i) grads.emplace_back(sizes[i], 0.01f);
        sim::compute(1ms);
        std::vector<std::span<const float>> views(grads.begin(), grads.end());
        s.step(views);
      }
    });
    CHECK(outcomes[1]);
    CHECK(!outcomes[0]);
    CHECK(!outcomes[3]);
    CHECK(lost == std::vector<int>{1});
  }
  SECTION("async parameter server, two servers: one server's death fails the other, not read as its workers' losses") {
    // Ranks 0-2 work, 3 and 4 serve; server 4 dies. Server 3 tolerates its workers' losses,
    // not a server's: every operation of its fails with peer_lost then, its pending worker
    // receives included, and it must fail (the restart hint), not drop each worker and pass.
    gw::ps::options o;
    o.servers = 2;
    const auto m = sim::parse_cluster_model("hosts=5 bandwidth=1Gbit latency=50us compute=modelled die=4@3ms");
    std::vector<int> lost_by_3;
    bool server_3_returned = false;
    sim::job job(m);
    sim::run_report report;
    const auto outcomes = job.run(
        [&](gw::transport::simulated t) {
          using S = strategy_of<agg::parameter_server<gw::ps::async>, gw::transport::simulated>;
          const int rank = t.rank();
          S s(std::move(t), make_params(), gw::optim::sgd({.lr = 0.01}), agg::parameter_server<gw::ps::async>(o));
          if (s.is_server()) {
            lost_by_3 = s.serve().lost_workers;
            server_3_returned = rank == 3;
            return;
          }
          for (int k = 0; k < 20; ++k) {
            std::vector<std::vector<float>> grads;
            for (std::size_t i = 0; i < sizes.size(); ++i) grads.emplace_back(sizes[i], 0.01f);
            sim::compute(1ms);
            std::vector<std::span<const float>> views(grads.begin(), grads.end());
            s.step(views);
          }
        },
        &report);
    CHECK(report.died == std::vector<int>{4});
    CHECK(!server_3_returned);
    CHECK(lost_by_3.empty());
    REQUIRE(outcomes[3]);
    const auto [kind, what] = gw::testing::error_of([&] { std::rethrow_exception(outcomes[3]); });
    CAPTURE(what);
    CHECK(kind == gw::errc::peer_lost);
    CHECK(what.find("rank 4") != std::string::npos);
  }
  SECTION("a death with no transport call after it is still a death; fail() tells the peers why") {
    const auto m = sim::parse_cluster_model("hosts=3 latency=50us compute=modelled die=1@1ms");
    std::string why;
    sim::job job(m);
    sim::run_report report;
    const auto outcomes = job.run(
        [&](gw::transport::simulated t) {
          std::byte b[4];
          if (t.rank() == 1) {
            sim::compute(5ms);  // dies at 1 ms, inside this compute
            return;
          }
          if (t.rank() == 2) {
            t.fail(gw::errc::mismatch, "rank 2 disagrees");
            return;
          }
          try {
            recv(t, 2, 1, b);
          } catch (const gw::error& e) {
            why = e.what();
            throw;
          }
        },
        &report);
    CHECK(report.died == std::vector<int>{1});
    CHECK(report.rank_end[1] == 1ms);
    REQUIRE(outcomes[0]);
    CHECK(why.find("rank 2 disagrees") != std::string::npos);
  }
  SECTION("a message that arrives before the receiver learns of a third rank's loss is received") {
    const auto m = sim::parse_cluster_model("hosts=3 latency=50us compute=modelled");
    std::uint32_t got = 0;
    sim::job job(m);
    job.run([&](gw::transport::simulated t) {
      std::uint32_t word = 5;
      auto bytes = std::as_writable_bytes(std::span(&word, 1));
      if (t.rank() == 0) {
        sim::compute(100ms);
        throw gw::error(gw::errc::invalid_argument, "rank 0 stops");
      }
      if (t.rank() == 2) {
        sim::compute(10ms);
        send(t, 1, 1, bytes);
        return;
      }
      recv(t, 2, 1, bytes);  // arrives at 10.05 ms; rank 0's loss is known at 100.05 ms
      got = word;
    });
    CHECK(got == 5);
  }
}

namespace {
// What a rank's second thread saw, for the test below.
struct second_thread_state {
  gw::transport::simulated* t = nullptr;
  gw::time_source time;
  sim::time_point woken{};
  bool signalled = false;
  bool sent = false;
  bool died = false;
  void (*work)(second_thread_state&) = nullptr;
};

// Starts rank `t`'s second thread running work(st) (a lambda without captures).
void start_second_thread(second_thread_state& st, gw::transport::simulated& t, void (*work)(second_thread_state&)) {
  st.t = &t;
  st.time = t.time();
  st.work = work;
  st.time.start_thread(
      [](void* p) {
        auto& s = *static_cast<second_thread_state*>(p);
        s.work(s);
      },
      &st);
}
}  // namespace

TEST_CASE("a rank's second thread runs beside its caller in virtual time: woken at the signaller's time, its message sent then, joined after") {
  // Rank 0 starts a second thread that waits for a signal; its caller computes 30 ms and
  // signals, computes 10 ms more and joins. The thread, woken at 30 ms, sends rank 1 a
  // message: it arrives one latency and its bytes' time after 30 ms, not at 40 ms (the
  // caller's time) nor at 0 (the thread's start).
  const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1Gbit latency=50us compute=modelled");
  second_thread_state st;
  sim::time_point caller_end{}, arrived{};
  sim::run(m, [&](gw::transport::simulated t) {
    std::vector<std::byte> buf(125'000);  // 1 ms at 1 Gbit/s
    if (t.rank() == 1) {
      recv(t, 0, 7, buf);
      arrived = sim::now();
      return;
    }
    start_second_thread(st, t, [](second_thread_state& s) {
          s.signalled = s.time.virtual_clock()->wait_signal(std::int64_t{10'000'000'000});
          s.woken = sim::now();
          std::vector<std::byte> msg(125'000);
          send(*s.t, 1, 7, msg);
          s.sent = true;
        });
    sim::compute(30ms);
    st.time.virtual_clock()->yield();  // the thread, behind, runs up to its wait first
    st.time.virtual_clock()->signal();
    sim::compute(10ms);
    st.time.join_thread();
    caller_end = sim::now();
  });
  REQUIRE(st.signalled);
  REQUIRE(st.sent);
  CHECK(st.woken == 30ms);
  CHECK(arrived == 30ms + 50us + 1ms);
  CHECK(caller_end == 40ms);  // the thread ended (its send done) before the caller's 40 ms
}

TEST_CASE("a rank's second thread does its work up to its rank's death, then ends there, waiting without a deadline") {
  // Rank 0 dies at 20 ms, found by its caller at 50 ms (its first transport call after its
  // compute). Its second thread, behind at 0, still sends rank 1 its message at 5 ms (before
  // the death), then waits for a signal without a deadline: it must end at the death, not
  // sleep forever.
  const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1Gbit latency=50us compute=modelled die=0@20ms");
  second_thread_state st;
  int got = 0;
  sim::job job(m);
  sim::run_report report;
  const auto outcomes = job.run(
      [&](gw::transport::simulated t) {
        if (t.rank() == 1) {
          recv(t, 0, 2, std::as_writable_bytes(std::span(&got, 1)));
          return;
        }
        start_second_thread(st, t, [](second_thread_state& s) {
              sim::compute(5ms);
              int x = 77;
              send(*s.t, 1, 2, std::as_bytes(std::span(&x, 1)));
              s.sent = true;
              try {
                s.time.virtual_clock()->wait_signal(std::numeric_limits<std::int64_t>::max());
              } catch (const sim::rank_died&) {
                s.died = true;
                s.woken = sim::now();
                throw;
              }
            });
        sim::compute(50ms);
        std::byte b{};
        send(t, 1, 1, std::span(&b, 1));  // dies here: its clock passed 20 ms
      },
      &report);
  REQUIRE(report.died == std::vector<int>{0});
  REQUIRE(!outcomes[0]);
  REQUIRE(!outcomes[1]);
  CHECK(st.sent);
  CHECK(got == 77);
  REQUIRE(st.died);
  CHECK(st.woken == 20ms);
  CHECK(report.rank_end[0] == 20ms);
}

TEST_CASE("restart=: a dead rank's replacement is taken back by a peer that allowed it, which drops what the dead "
          "process sent it unread, and is absent to a peer that did not") {
  // Rank 2 sends rank 0 a message (111) nobody receives, and dies at 10 ms; its replacement
  // starts at 20 ms and sends the same tag (222). Rank 0 allowed rank 2 back: at 30 ms its
  // receive gets 222, and its answer reaches the replacement. Rank 1 did not: its send to
  // rank 2 fails, and so does the replacement's to it.
  const auto m = sim::parse_cluster_model("hosts=3 bandwidth=1Gbit latency=50us compute=modelled die=2@10ms restart=2@20ms");
  std::vector<int> got(3, 0);
  std::vector<std::string> failures(3);
  std::vector<int> incarnations(3, 0);
  sim::job job(m);
  sim::run_report report;
  const auto outcomes = job.run(
      [&](gw::transport::simulated t) {
        const int r = t.rank();
        ++incarnations[static_cast<std::size_t>(r)];
        auto bytes = [](int& v) { return std::as_writable_bytes(std::span(&v, 1)); };
        if (r == 2 && !t.rejoined()) {
          int stale = 111;
          send(t, 0, 5, bytes(stale));
          sim::compute(15ms);
          send(t, 0, 7, bytes(stale));  // dies here: its clock passed 10 ms
          return;
        }
        if (r == 2) {  // the replacement, from 20 ms
          CHECK(sim::now() == 20ms);
          int fresh = 222;
          send(t, 0, 5, bytes(fresh));
          recv(t, 0, 6, bytes(got[2]));
          try {
            send(t, 1, 8, bytes(fresh));
          } catch (const gw::error& e) {
            failures[2] = e.what();
            CHECK(e.kind() == gw::errc::peer_lost);
          }
          return;
        }
        if (r == 0) t.allow_rejoin(2);
        else t.tolerate_loss(2);
        sim::compute(30ms);
        if (r == 0) {
          recv(t, 2, 5, bytes(got[0]));
          int answer = 333;
          send(t, 2, 6, bytes(answer));
        } else {
          int x = 1;
          try {
            send(t, 2, 9, bytes(x));
          } catch (const gw::error& e) {
            failures[1] = e.what();
            CHECK(e.kind() == gw::errc::peer_lost);
          }
        }
      },
      &report);
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    if (outcomes[r]) FAIL(gw::testing::error_of([&] { std::rethrow_exception(outcomes[r]); }).second);
  }
  CHECK(report.died == std::vector<int>{2});
  CHECK(incarnations == std::vector<int>{1, 1, 2});
  CHECK(got[0] == 222);
  CHECK(got[2] == 333);
  CHECK_THAT(failures[1], Catch::Contains("rank 2"));
  CHECK_THAT(failures[2], Catch::Contains("did not take this replacement back"));
}

TEST_CASE("restart= without a death before it is refused, naming the rank") {
  const auto [kind, what] = gw::testing::error_of([] { sim::parse_cluster_model("hosts=2 restart=1@5ms").validate(); });
  CHECK(kind == gw::errc::config);
  CHECK_THAT(what, Catch::Contains("restart=1@...: rank 1 does not die before it"));
}

TEST_CASE("a signal given while a rank's other thread is on its way to waiting is kept for it, not lost") {
  // The second thread computes 5 ms and sends (its turn goes to the caller, behind it at
  // 2 ms), and only then waits: the caller's signal at 2 ms came before that wait, and the
  // wait must find it at once, not sleep to its deadline.
  const auto m = sim::parse_cluster_model("hosts=2 bandwidth=1Gbit latency=50us compute=modelled");
  second_thread_state st;
  sim::run(m, [&](gw::transport::simulated t) {
    if (t.rank() == 1) {
      std::byte b{};
      recv(t, 0, 3, std::span(&b, 1));
      return;
    }
    start_second_thread(st, t, [](second_thread_state& s) {
          sim::compute(5ms);
          std::byte b{};
          send(*s.t, 1, 3, std::span(&b, 1));
          s.signalled = s.time.virtual_clock()->wait_signal(std::int64_t{10'000'000'000});
          s.woken = sim::now();
        });
    sim::compute(2ms);
    st.time.virtual_clock()->yield();
    st.time.virtual_clock()->signal();
    st.time.join_thread();
  });
  CHECK(st.signalled);
  CHECK(st.woken < 6ms);
}

TEST_CASE("restart=: a receive waiting for a replacement goes on waiting when another rank is lost meanwhile") {
  // Rank 3 dies at 1 ms and restarts at 4 ms. Rank 0 allowed it back and, at 2 ms, posts a
  // receive from it; rank 1 returns after 3 ms, once that receive is posted (a loss to rank 0
  // too). The receive must still get the replacement's message.
  const auto m = sim::parse_cluster_model("hosts=4 bandwidth=1Gbit latency=50us compute=modelled die=3@1ms restart=3@4ms");
  int got = 0;
  const auto outcomes = sim::job(m).run([&](gw::transport::simulated t) {
    const int r = t.rank();
    auto bytes = [](int& v) { return std::as_writable_bytes(std::span(&v, 1)); };
    if (r == 3 && !t.rejoined()) {
      sim::compute(2ms);
      int x = 0;
      send(t, 0, 9, bytes(x));  // dies here
      return;
    }
    if (r == 3) {
      int fresh = 444;
      send(t, 0, 5, bytes(fresh));
      return;
    }
    if (r == 1) {  // at 3 ms a transport call (its turn goes to rank 0, behind), then returns
      t.tolerate_loss(3);
      sim::compute(3ms);
      int x = 1;
      send(t, 2, 4, bytes(x));
      return;
    }
    if (r == 2) {
      t.tolerate_loss(3);
      int x = 0;
      recv(t, 1, 4, bytes(x));
      return;
    }
    t.allow_rejoin(3);
    t.tolerate_loss(1);
    t.tolerate_loss(2);
    sim::compute(2ms);
    recv(t, 3, 5, bytes(got));
  });
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    if (outcomes[r]) FAIL(gw::testing::error_of([&] { std::rethrow_exception(outcomes[r]); }).second);
  }
  CHECK(got == 444);
}
