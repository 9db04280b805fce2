// Ranks that disagree about a collective get a mismatch error naming both sides, never a hang.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <gradwire/collective/all_gather.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/chunking.hpp>
#include <gradwire/collective/halving_doubling_all_reduce.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <gradwire/collective/hierarchical_all_reduce.hpp>
#include <gradwire/collective/one_shot_all_reduce.hpp>
#include <gradwire/collective/ring_all_reduce.hpp>
#include <gradwire/collective/reduce.hpp>
#include <gradwire/collective/reduce_scatter.hpp>
#include <gradwire/support/topology.hpp>
#include <gradwire/transport/inproc.hpp>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "collective_support.hpp"
#include "helpers/call_probe.hpp"
#include "helpers/errors.hpp"

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
  SECTION("barrier against all_reduce: each collective named") {
    auto out = run_collect(2, [](auto& comm) {
      std::vector<float> v(10);
      if (comm.rank() == 0)
        gw::collective::barrier(comm);
      else
        gw::collective::all_reduce(comm, std::span<float>(v));
    });
    for (auto& o : out) {
      REQUIRE(o.kind == gw::errc::mismatch);
      REQUIRE_THAT(o.what, Catch::Contains("rank 0 called barrier(") && Catch::Contains("all_reduce(count=10"));
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

TEST_CASE("a reduce_op outside the enum is refused by every reduction, before anything is sent") {
  using gw::collective::reduce_op;
  using call = std::function<void(gw::collective::communicator<gw::transport::inproc>&, std::span<float>, reduce_op)>;
  const std::vector<std::pair<std::string, call>> reductions{
      {"ring_all_reduce", [](auto& c, auto v, auto op) { gw::collective::ring_all_reduce(c, v, op); }},
      {"halving_doubling_all_reduce", [](auto& c, auto v, auto op) { gw::collective::halving_doubling_all_reduce(c, v, op); }},
      {"one_shot_all_reduce", [](auto& c, auto v, auto op) { gw::collective::one_shot_all_reduce(c, v, op); }},
      {"hierarchical_all_reduce", [](auto& c, auto v, auto op) { gw::collective::hierarchical_all_reduce(c, v, op); }},
      {"reduce_scatter", [](auto& c, auto v, auto op) { gw::collective::reduce_scatter(c, v, op); }},
      {"reduce", [](auto& c, auto v, auto op) { gw::collective::reduce(c, v, 0, op); }},
  };
  for (const auto& [name, reduction] : reductions)
    for (std::uint32_t bad : {0u, 3u, 0xffffffffu}) {
      CAPTURE(name, bad);
      std::vector<std::pair<gw::errc, std::string>> refused(3);
      std::vector<std::vector<float>> after(3);
      auto out = run_collect(3, [&](auto& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        std::vector<float> v(6, float(comm.rank() + 1));
        refused[r] = gw::testing::error_of([&] { reduction(comm, v, static_cast<reduce_op>(bad)); });
        // Refused before a sequence number or a byte went out: the next call pairs up as usual.
        gw::collective::all_reduce(comm, std::span<float>(v), reduce_op::average);
        after[r] = v;
      });
      for (int r = 0; r < 3; ++r) {
        const auto i = static_cast<std::size_t>(r);
        REQUIRE(out[i].kind == gw::errc{});
        REQUIRE(refused[i].first == gw::errc::invalid_argument);
        REQUIRE_THAT(refused[i].second, Catch::StartsWith(name + ": unknown reduce_op " + std::to_string(bad)));
        REQUIRE(after[i] == std::vector<float>(6, 2.0f));  // the average of 1, 2 and 3
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
  // A rank that waited for the absent one: "rank R: receive from rank 2 (tag T, N bytes) did
  // not complete before its deadline (is a rank missing or behind?)" (docs/errors.md, timeout),
  // then what() appends the kind.
  const std::string missed =
      R"(receive from rank 2 \(tag \d+, \d+ bytes\) did not complete before its deadline \(is a rank missing or behind\?\): timeout)";
  int timeouts = 0;
  for (int r : {0, 1}) {
    REQUIRE(raw[r]);
    try {
      std::rethrow_exception(raw[r]);
    } catch (const gw::error& e) {
      const std::string what = e.what();
      CAPTURE(r, what);
      const std::string who = "rank " + std::to_string(r) + ": ", other = "rank " + std::to_string(1 - r);
      // Every rank reports a timeout: its own, or the first one's, heard of before its own
      // deadline (a timeout keeps its kind on every rank: transport::detail::peer_failure_kind),
      // "rank R: OPERATION abandoned: rank P failed: rank P: receive ...".
      REQUIRE(e.kind() == gw::errc::timeout);
      if (what.find(" abandoned: ") == std::string::npos) {
        ++timeouts;
        REQUIRE_THAT(what, Catch::Matches(who + missed));
      } else {
        REQUIRE_THAT(what, Catch::Matches(who + ".* abandoned: " + other + " failed: " + other + ": " + missed +
                                          ": timeout"));
      }
    }
  }
  REQUIRE(timeouts >= 1);
  REQUIRE_FALSE(raw[2]);
}

// --- The check rides beside the data: no collective waits for it before posting data ---

namespace {

// inproc that logs, per rank, each message it posts ('d' data, 'c' a check frame) and
// each wait ('w'): a wait before the first data is posted is a round spent on the check.
struct recording {
  using request = gw::transport::inproc::request;
  gw::transport::inproc inner;
  std::string* log;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  const gw::cluster::topology& topology() const { return inner.topology(); }
  void fail(gw::errc cause, const std::string& reason) { inner.fail(cause, reason); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) {
    note(tag);
    return inner.async_send(peer, tag, b);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) {
    note(tag);
    return inner.async_recv(peer, tag, b);
  }
  void wait(request& r, gw::deadline until) {
    *log += 'w';
    inner.wait(r, until);
  }
  void note(std::uint64_t tag) { *log += (tag & 0xffff) >= gw::collective::detail::verify_from_left ? 'c' : 'd'; }
};

using recorded_comm = gw::collective::communicator<recording>;

struct collective_case {
  const char* name;
  std::size_t count;
  std::function<void(recorded_comm&, std::span<float>)> run;
};

std::vector<collective_case> collective_cases(int ranks) {
  namespace col = gw::collective;
  // Above small_all_reduce_bytes: reduce takes the ring reduce-scatter + gather.
  const std::size_t large = col::communicator_options{}.small_all_reduce_bytes / sizeof(float) + 5;
  std::vector<collective_case> cases = {
      {"broadcast from 0", 1000, [](auto& c, auto v) { col::broadcast(c, v, 0); }},
      {"broadcast from the last rank", 1000, [](auto& c, auto v) { col::broadcast(c, v, c.size() - 1); }},
      {"broadcast inside the check frame", 4, [](auto& c, auto v) { col::broadcast(c, v, 1 % c.size()); }},
      {"reduce by tree", 1000, [](auto& c, auto v) { col::reduce(c, v, 0); }},
      {"reduce by scatter-gather", large, [](auto& c, auto v) { col::reduce(c, v, c.size() / 2); }},
      {"reduce_scatter", 1000, [](auto& c, auto v) { col::reduce_scatter(c, v); }},
      {"all_gather", 1000, [](auto& c, auto v) { col::all_gather(c, v); }},
      {"ring", 1000, [](auto& c, auto v) { col::all_reduce<col::ring>(c, v); }},
      {"halving_doubling", 1000, [](auto& c, auto v) { col::all_reduce<col::halving_doubling>(c, v); }},
      {"hierarchical", 1000, [](auto& c, auto v) { col::all_reduce<col::hierarchical>(c, v); }},
  };
  if (ranks <= col::one_shot_max_ranks) {
    cases.push_back({"one_shot in the frames", 4, [](auto& c, auto v) { col::one_shot_all_reduce(c, v); }});
    cases.push_back({"one_shot beside the frames", 1000, [](auto& c, auto v) { col::one_shot_all_reduce(c, v); }});
  }
  return cases;
}

// Ranks on two pretend hosts, alternating, so the hierarchical rings' peers are not ring
// neighbours (far frames) where there are three or more ranks.
gw::cluster::topology alternating_hosts(int ranks) {
  std::vector<int> hosts;
  for (int r = 0; r < ranks; ++r) hosts.push_back(r % 2);
  return gw::cluster::topology(hosts);
}

}  // namespace

TEST_CASE("every collective posts its first data before it waits for the call check: the check takes no round") {
  const int ranks = GENERATE(2, 3, 4, 5, 8);
  for (const auto& c : collective_cases(ranks)) {
    CAPTURE(ranks, c.name);
    std::vector<std::string> logs(static_cast<std::size_t>(ranks));
    std::vector<std::vector<float>> data(static_cast<std::size_t>(ranks));
    gw::transport::inproc_group group{alternating_hosts(ranks)};
    auto raw = group.run([&](gw::transport::inproc t) {
      const int me = t.rank();
      recorded_comm comm(recording{t, &logs[me]}, {.timeout = 30s});
      data[me].assign(c.count, 1.0f);
      c.run(comm, std::span<float>(data[me]));
    });
    for (int r = 0; r < ranks; ++r) {
      const std::string& log = logs[r];
      CAPTURE(r, log);
      REQUIRE_FALSE(raw[r]);
      REQUIRE(log.find('c') < log.find('w'));  // the check is posted, and before any wait
      // A rank whose data all comes in check frames posts none; every other posts data first.
      if (log.find('d') != std::string::npos) REQUIRE(log.find('d') < log.find('w'));
    }
    // And the collective did its job (1 from every rank): the sum, or the root's data.
    const std::string name = c.name;
    if (name.rfind("broadcast", 0) == 0)
      for (int r = 0; r < ranks; ++r) REQUIRE(data[r][0] == 1.0f);
    else if (name == "ring" || name == "halving_doubling" || name == "hierarchical" || name.rfind("one_shot", 0) == 0)
      for (int r = 0; r < ranks; ++r) REQUIRE(data[r].back() == float(ranks));
  }
}

TEST_CASE("a verified barrier, and a broadcast that fits the check frame, send no more messages than unverified") {
  for (const bool verify : {false, true}) {
    CAPTURE(verify);
    std::vector<gw::transport::traffic_counters> barrier_sent(2), broadcast_sent(2);
    std::vector<float> got(2);
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      gw::collective::communicator comm(t, {.timeout = 30s, .verify = verify});
      const int me = comm.rank();
      auto before = comm.transport().traffic();
      gw::collective::barrier(comm);
      barrier_sent[me] = comm.transport().traffic() - before;
      std::vector<float> v(16, me == 1 ? 7.0f : 0.0f);  // 64 bytes, from rank 1
      before = comm.transport().traffic();
      gw::collective::broadcast(comm, std::span<float>(v), 1);
      broadcast_sent[me] = comm.transport().traffic() - before;
      got[me] = v[15];
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(barrier_sent[r].messages_sent == 1);  // verified: the check frame is the barrier's message
      REQUIRE(got[r] == 7.0f);
    }
    REQUIRE(broadcast_sent[1].messages_sent == 1);                   // the root: its data, in its frame when verified
    REQUIRE(broadcast_sent[0].messages_sent == (verify ? 1u : 0u));  // the leaf: its check frame
  }
}

namespace {
// Holds back every rank's report of its failure to the others (fail()) until each rank has
// settled its own call check: waited for every check frame it posted a receive for, or
// ended, or is itself holding a report. So a rank that found a mismatch cannot tell the
// rest before their own checks ran, and each rank shows what its own exchanges found.
struct report_gate {
  enum class state { running, reporting, ended };
  explicit report_gate(int ranks)
      : posted(static_cast<std::size_t>(ranks), 0), received(static_cast<std::size_t>(ranks), 0),
        states(static_cast<std::size_t>(ranks), state::running) {}
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> posted, received;  // check-frame receives, per rank
  std::vector<state> states;
  bool gave_up = false;  // a report waited 20 s in vain (the test fails; nobody hangs)

  bool all_settled() const {
    for (std::size_t r = 0; r < states.size(); ++r)
      if (states[r] == state::running && !(posted[r] > 0 && received[r] == posted[r])) return false;
    return true;
  }
  template <class Change>
  void note(Change&& change) {
    std::lock_guard lock(mutex);
    change();
    changed.notify_all();
  }
};

// inproc whose failure reports wait at the gate. Its requests remember whether they
// receive a check frame.
struct held_reports {
  struct request {
    gw::transport::inproc::request inner;
    bool check_frame = false;
  };
  gw::transport::inproc inner;
  report_gate* gate;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  const gw::cluster::topology& topology() const { return inner.topology(); }
  void fail(gw::errc cause, const std::string& reason) {
    {
      std::unique_lock lock(gate->mutex);
      gate->states[static_cast<std::size_t>(rank())] = report_gate::state::reporting;
      gate->changed.notify_all();
      if (!gate->changed.wait_for(lock, 20s, [&] { return gate->all_settled(); })) gate->gave_up = true;
    }
    inner.fail(cause, reason);
  }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) { return {inner.async_send(peer, tag, b)}; }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) {
    const bool check_frame = (tag & 0xffff) >= gw::collective::detail::verify_from_left;
    if (check_frame) gate->note([&] { ++gate->posted[static_cast<std::size_t>(rank())]; });
    return {inner.async_recv(peer, tag, b), check_frame};
  }
  void wait(request& r, gw::deadline until) {
    inner.wait(r.inner, until);
    if (r.check_frame) gate->note([&] { ++gate->received[static_cast<std::size_t>(rank())]; });
  }
};
static_assert(gw::concepts::failable_transport<held_reports>);

// Marks its rank ended (returned or thrown) at the gate.
struct ended_at_gate {
  report_gate& gate;
  int rank;
  ~ended_at_gate() {
    gate.note([&] { gate.states[static_cast<std::size_t>(rank)] = report_gate::state::ended; });
  }
};
}  // namespace

TEST_CASE("a far peer that disagrees is reported as the calls' mismatch, never as a bare size mismatch") {
  namespace col = gw::collective;
  // Ranks 0-3 call with 300 elements, 4-7 with 301. Ranks 1, 2, 5 and 6 agree with both
  // ring neighbours but exchange data with a rank of the other half: halving-doubling's
  // first partner (distance 4), the trees rooted at rank 1 (rank 5 is its child),
  // one-shot's every peer, the hierarchical host rings on alternating hosts (2 and 4).
  // Without far frames those ranks saw a bare size mismatch unless a boundary rank's
  // report overtook the data (held_reports makes sure it does not: the reports wait until
  // every rank's own check has run).
  using comm_type = gw::collective::communicator<held_reports>;
  const std::vector<std::pair<const char*, std::function<void(comm_type&, std::span<float>)>>> cases = {
      {"broadcast", [](auto& c, auto v) { col::broadcast(c, v, 1); }},
      {"reduce", [](auto& c, auto v) { col::reduce(c, v, 1); }},
      {"halving_doubling", [](auto& c, auto v) { col::all_reduce<col::halving_doubling>(c, v); }},
      {"hierarchical", [](auto& c, auto v) { col::all_reduce<col::hierarchical>(c, v); }},
      {"one_shot", [](auto& c, auto v) { col::one_shot_all_reduce(c, v); }}};
  const int ranks = 8;
  for (const auto& [name, run] : cases) {
    CAPTURE(name);
    report_gate gate(ranks);
    gw::transport::inproc_group group{alternating_hosts(ranks)};
    auto raw = group.run([&](gw::transport::inproc t) {
      const ended_at_gate ended{gate, t.rank()};
      comm_type comm(held_reports{t, &gate}, {.timeout = 30s});
      std::vector<float> v(comm.rank() < ranks / 2 ? 300 : 301, 1.0f);
      run(comm, std::span<float>(v));
    });
    REQUIRE_FALSE(gate.gave_up);
    // A rank whose own exchanges all agreed may finish before the report reaches it;
    // every rank that fails names both calls, and ranks of both halves fail.
    int failed_low = 0, failed_high = 0;
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      if (!raw[r]) continue;
      (r < ranks / 2 ? failed_low : failed_high) += 1;
      try {
        std::rethrow_exception(raw[r]);
      } catch (const gw::error& e) {
        const std::string what = e.what();
        CAPTURE(what);
        REQUIRE(e.kind() == gw::errc::mismatch);
        REQUIRE_THAT(what, Catch::Contains("collective mismatch") && Catch::Contains("count=301") &&
                               Catch::Contains("count=300"));
      }
    }
    REQUIRE(failed_low > 0);
    REQUIRE(failed_high > 0);
  }
}

// --- communicator_options::verify = false: no call check (docs/errors.md, "The call check") ---

namespace {

// What a collective leaves where, for the reference to check.
enum class leaves { sum_everywhere, own_chunk_summed, sum_at_root, roots_data_everywhere, everything_gathered, nothing };

struct unchecked_case {
  const char* name;
  std::size_t count;
  leaves result;
  int (*root)(int ranks);  // for the rooted ones
  std::function<void(gw::collective::communicator<gw::test::call_probe<gw::transport::inproc>>&, std::span<double>)> run;
};

std::vector<unchecked_case> unchecked_cases() {
  namespace col = gw::collective;
  auto none = [](int) { return 0; };
  auto last = [](int ranks) { return ranks - 1; };
  auto middle = [](int ranks) { return ranks / 2; };
  auto second = [](int ranks) { return 1 % ranks; };
  // Above small_all_reduce_bytes: reduce takes the ring reduce-scatter + gather.
  const std::size_t large = col::communicator_options{}.small_all_reduce_bytes / sizeof(double) + 5;
  return {
      {"ring", 1003, leaves::sum_everywhere, none, [](auto& c, auto v) { col::all_reduce<col::ring>(c, v); }},
      {"ring pipelined", 300001, leaves::sum_everywhere, none, [](auto& c, auto v) { col::all_reduce<col::ring>(c, v); }},
      {"halving_doubling", 1003, leaves::sum_everywhere, none,
       [](auto& c, auto v) { col::all_reduce<col::halving_doubling>(c, v); }},
      {"halving_doubling, fewer elements than ranks", 5, leaves::sum_everywhere, none,
       [](auto& c, auto v) { col::all_reduce<col::halving_doubling>(c, v); }},
      {"one_shot, small enough for the frames", 4, leaves::sum_everywhere, none,
       [](auto& c, auto v) { col::one_shot_all_reduce(c, v); }},
      {"one_shot", 1003, leaves::sum_everywhere, none, [](auto& c, auto v) { col::one_shot_all_reduce(c, v); }},
      {"hierarchical", 1003, leaves::sum_everywhere, none,
       [](auto& c, auto v) { col::all_reduce<col::hierarchical>(c, v); }},
      {"reduce by tree", 1003, leaves::sum_at_root, last, [](auto& c, auto v) { col::reduce(c, v, c.size() - 1); }},
      {"reduce by scatter-gather", large, leaves::sum_at_root, middle,
       [](auto& c, auto v) { col::reduce(c, v, c.size() / 2); }},
      {"reduce_scatter", 1003, leaves::own_chunk_summed, none, [](auto& c, auto v) { col::reduce_scatter(c, v); }},
      {"all_gather", 1003, leaves::everything_gathered, none, [](auto& c, auto v) { col::all_gather(c, v); }},
      {"broadcast, small enough for the frame", 4, leaves::roots_data_everywhere, second,
       [](auto& c, auto v) { col::broadcast(c, v, 1 % c.size()); }},
      {"broadcast", 1003, leaves::roots_data_everywhere, none, [](auto& c, auto v) { col::broadcast(c, v, 0); }},
      {"barrier", 0, leaves::nothing, none, [](auto& c, auto) { col::barrier(c); }},
  };
}

}  // namespace

TEST_CASE("with the call check off (verify = false) every collective is still right and sends no check frame") {
  const int ranks = GENERATE(2, 3, 5, 8);
  const std::uint64_t seed = std::random_device{}();
  for (const auto& c : unchecked_cases())
    for (const bool verify : {false, true}) {
      CAPTURE(ranks, c.name, verify, seed);
      std::vector<std::vector<double>> inputs(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r) inputs[r] = gw::test::random_input<double>(seed, r, c.count);
      const gw::collective::detail::chunking chunks{c.count, static_cast<std::size_t>(ranks)};
      auto data = inputs;
      if (c.result == leaves::everything_gathered)  // each rank holds only its chunk of input 0
        for (int r = 0; r < ranks; ++r)
          for (std::size_t i = 0; i < c.count; ++i)
            data[r][i] = i < chunks.begin(r) || i >= chunks.begin(r) + chunks.length(r) ? std::nan("") : inputs[0][i];
      std::vector<gw::test::call_log> logs(static_cast<std::size_t>(ranks));
      gw::transport::run_inproc(alternating_hosts(ranks), [&](gw::transport::inproc t) {
        const int me = t.rank();
        gw::collective::communicator comm(gw::test::call_probe<gw::transport::inproc>{t, &logs[me]},
                                          {.timeout = 30s, .verify = verify});
        c.run(comm, std::span<double>(data[me]));
      });
      std::size_t frames = 0;
      for (const auto& log : logs) frames += log.check_frames;
      if (verify)
        REQUIRE(frames > 0);  // the probe sees them when they are there
      else
        REQUIRE(frames == 0);
      const auto sum = gw::test::serial_reduce(inputs, false);
      const double tolerance = gw::test::sum_tolerance<double>(ranks);
      const int root = c.root(ranks);
      for (int r = 0; r < ranks; ++r) {
        CAPTURE(r);
        switch (c.result) {
          case leaves::sum_everywhere: REQUIRE(gw::test::count_wrong(data[r], sum, tolerance) == 0); break;
          case leaves::own_chunk_summed:
            REQUIRE(gw::test::count_wrong(data[r], sum, tolerance, chunks.begin(r), chunks.begin(r) + chunks.length(r)) == 0);
            break;
          case leaves::sum_at_root:
            if (r == root) REQUIRE(gw::test::count_wrong(data[r], sum, tolerance) == 0);
            break;
          case leaves::roots_data_everywhere: REQUIRE(data[r] == inputs[root]); break;
          case leaves::everything_gathered: REQUIRE(data[r] == inputs[0]); break;
          case leaves::nothing: break;
        }
      }
    }
}

TEST_CASE("with the call check off a disagreement is no longer named: a size mismatch, or silently wrong numbers") {
  SECTION("different counts: the ring's messages differ in size") {
    // 2 ranks, ring chunks of 50 + 50 (100 floats) against 50 + 49 (99): rank 0 sends its
    // chunk 1 (200 bytes) to rank 1, which expects 196.
    for (const bool verify : {false, true}) {
      CAPTURE(verify);
      auto out = gw::test::run_collect(2, {.timeout = 5s, .verify = verify}, [](auto& comm) {
        std::vector<float> v(comm.rank() == 1 ? 99 : 100, 1.0f);
        gw::collective::all_reduce<gw::collective::ring>(comm, std::span<float>(v));
      });
      for (int r = 0; r < 2; ++r) {
        CAPTURE(r, out[r].what);
        REQUIRE(out[r].kind == gw::errc::mismatch);
        if (verify)
          REQUIRE_THAT(out[r].what, Catch::Contains("collective mismatch: rank ") &&
                                        Catch::Contains("all_reduce(count=99, dtype=f32, op=sum) by ring"));
        else
          REQUIRE_THAT(out[r].what, Catch::Contains("message size mismatch: rank 0 sent 200 bytes") &&
                                        Catch::Contains("but rank 1 expected 196") &&
                                        !Catch::Contains("collective mismatch"));
      }
    }
  }
  SECTION("sum against average: no error, each rank's chunk reduced its way") {
    // Rank 0 sums, rank 1 averages: the ring's rank 0 reduces chunk 0 (elements 0-4) and
    // rank 1 chunk 1 (5-9), each by its own operation, and both ranks get both chunks.
    const std::size_t n = 10;
    std::vector<std::vector<double>> data(2, std::vector<double>(n));
    for (std::size_t i = 0; i < n; ++i) data[0][i] = double(i + 1), data[1][i] = 10.0 * double(i + 1);
    auto out = gw::test::run_collect(2, {.timeout = 5s, .verify = false}, [&](auto& comm) {
      gw::collective::all_reduce<gw::collective::ring>(
          comm, std::span<double>(data[comm.rank()]),
          comm.rank() == 0 ? gw::collective::reduce_op::sum : gw::collective::reduce_op::average);
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].kind == gw::errc{});
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(data[r][i] == (i < n / 2 ? 11.0 : 5.5) * double(i + 1));
      }
    }
  }
}
