// Ranks that disagree about a collective get a mismatch error naming both sides, never a hang.
#include <catch2/catch.hpp>

#include <chrono>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <gradwire/transport/inproc.hpp>
#include <string>
#include <vector>

namespace gw = gradwire;
using namespace std::chrono_literals;

namespace {

struct outcome {
  gw::errc kind{};
  std::string what;
};

// Runs fn on each rank; returns each rank's error (kind {} for success) and asserts
// the whole run ended well before the generous per-step timeout.
template <class Fn>
std::vector<outcome> run_collect(int ranks, Fn fn) {
  gw::transport::inproc_group group(ranks);
  const auto start = std::chrono::steady_clock::now();
  auto raw = group.run([&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 30s});
    fn(comm);
  });
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
  std::vector<outcome> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    if (!raw[r]) continue;
    try {
      std::rethrow_exception(raw[r]);
    } catch (const gw::error& e) {
      out[r] = {e.kind(), e.what()};
    } catch (const std::exception& e) {
      out[r] = {gw::errc::config, e.what()};
    }
  }
  return out;
}

}  // namespace

TEST_CASE("all-reduce with different counts names both ranks and both counts") {
  const int ranks = GENERATE(2, 3, 4, 7);
  const int odd_one = ranks - 1;
  CAPTURE(ranks);
  auto out = run_collect(ranks, [&](auto& comm) {
    std::vector<float> v(comm.rank() == odd_one ? 99 : 100, 1.0f);
    gw::collective::all_reduce(comm, std::span<float>(v));
  });
  // The odd rank's neighbours detect it; the first detection fails every rank with it.
  const std::string odd_call = "rank " + std::to_string(odd_one) + " called all_reduce(count=99, dtype=f32, op=sum)";
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(out[r].kind == gw::errc::mismatch);
    REQUIRE_THAT(out[r].what, Catch::Contains(odd_call) && Catch::Contains("called all_reduce(count=100"));
  }
}

TEST_CASE("all-reduce with different dtypes or different operations is a mismatch") {
  SECTION("f32 against f64") {
    auto out = run_collect(3, [](auto& comm) {
      if (comm.rank() == 1) {
        std::vector<double> v(10);
        gw::collective::all_reduce(comm, std::span<double>(v));
      } else {
        std::vector<float> v(10);
        gw::collective::all_reduce(comm, std::span<float>(v));
      }
    });
    for (auto& o : out) {
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("rank 1 called all_reduce(count=10, dtype=f64") && Catch::Contains("dtype=f32"));
    }
  }
  SECTION("all_reduce against broadcast") {
    auto out = run_collect(2, [](auto& comm) {
      std::vector<float> v(10);
      if (comm.rank() == 0)
        gw::collective::all_reduce(comm, std::span<float>(v));
      else
        gw::collective::broadcast(comm, std::span<float>(v), 0);
    });
    for (auto& o : out) {
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("all_reduce(count=10") && Catch::Contains("broadcast(count=10"));
    }
  }
  SECTION("sum against average") {
    auto out = run_collect(2, [](auto& comm) {
      std::vector<float> v(4);
      gw::collective::all_reduce(comm, std::span<float>(v),
                                 comm.rank() ? gw::collective::reduce_op::average : gw::collective::reduce_op::sum);
    });
    for (auto& o : out) {
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("op=average") && Catch::Contains("op=sum"));
    }
  }
}

TEST_CASE("a rank that skips a collective makes the others time out, within their timeout") {
  gw::transport::inproc_group group(3);
  const auto start = std::chrono::steady_clock::now();
  auto raw = group.run([&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = 300ms});
    if (t.rank() == 2) return;  // never joins, but does not fail either
    gw::collective::barrier(comm);
  });
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(took >= 300ms);
  REQUIRE(took < 10s);
  int timeouts = 0;
  for (int r : {0, 1}) {
    REQUIRE(raw[r]);
    try {
      std::rethrow_exception(raw[r]);
    } catch (const gw::error& e) {
      // The first to time out fails; the other may then see it as a lost peer.
      REQUIRE((e.kind() == gw::errc::timeout || e.kind() == gw::errc::peer_lost));
      timeouts += e.kind() == gw::errc::timeout;
    }
  }
  REQUIRE(timeouts >= 1);
  REQUIRE_FALSE(raw[2]);
}
