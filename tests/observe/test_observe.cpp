// Observability: per-step stats, the timeline recorder and GRADWIRE_LOG lines, checked
// against what the ranks really did (traffic conservation, the servers' own histograms).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gradwire/gradwire.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace gw = gradwire;
using namespace std::chrono_literals;

namespace {
std::vector<gw::host_tensor<float>> make_params(std::initializer_list<std::size_t> sizes) {
  std::vector<gw::host_tensor<float>> params;
  for (std::size_t n : sizes) {
    params.emplace_back(gw::shape{n});
    for (std::size_t i = 0; i < n; ++i) params.back()[i] = 0.01f * static_cast<float>(i % 97);
  }
  return params;
}
std::vector<std::vector<float>> make_grads(const std::vector<gw::host_tensor<float>>& params, int rank, int step) {
  std::vector<std::vector<float>> grads;
  for (const auto& p : params) {
    grads.emplace_back(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) grads.back()[i] = 0.001f * static_cast<float>((i + rank + step) % 13);
  }
  return grads;
}
std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
// What `fn` writes to the process's stderr (file descriptor 2, where the library's
// fprintf reports go), captured through a temporary file.
template <class F>
std::string stderr_of(F&& fn) {
  std::fflush(stderr);
  std::FILE* sink = std::tmpfile();
  REQUIRE(sink != nullptr);
  const int saved = ::dup(2);
  ::dup2(::fileno(sink), 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(sink);
  std::string out;
  for (int c; (c = std::fgetc(sink)) != EOF;) out += static_cast<char>(c);
  std::fclose(sink);
  return out;
}
}  // namespace

TEST_CASE("step stats: bytes match the transport's counters, and what ranks send, ranks receive") {
  for (int ranks : {2, 3, 4}) {
    CAPTURE(ranks);
    constexpr int steps = 3;
    const std::size_t model_bytes = (1000 + 37) * sizeof(float);
    std::vector<gw::observe::step_stats> last(ranks), total(ranks);
    std::vector<gw::support::traffic_counters> in_steps(ranks);
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      const int r = t.rank();
      auto params = make_params({1000, 37});
      gw::mirrored<gw::host_tensor<float>, gw::optim::sgd> s(t, std::move(params), gw::optim::sgd({.lr = 0.1}));
      for (int k = 0; k < steps; ++k) {
        const auto before = s.communicator().transport().traffic();
        s.step(make_grads(make_params({1000, 37}), r, k));
        in_steps[r] += s.communicator().transport().traffic() - before;
        REQUIRE(s.last_step_stats().traffic == s.communicator().transport().traffic() - before);
      }
      last[r] = s.last_step_stats();
      total[r] = s.cumulative_stats();
    });
    std::uint64_t sent = 0, received = 0, sent_last_step = 0;
    for (int r = 0; r < ranks; ++r) {
      REQUIRE(last[r].steps == 1);
      REQUIRE(last[r].traffic_measured);
      REQUIRE(total[r].steps == steps);
      REQUIRE(total[r].traffic == in_steps[r]);
      REQUIRE(last[r].in_step >= last[r].optimizer);
      REQUIRE(last[r].optimizer > 0ns);
      sent += total[r].traffic.bytes_sent;
      sent_last_step += last[r].traffic.bytes_sent;
      received += total[r].traffic.bytes_received;
    }
    REQUIRE(sent == received);
    // Every all-reduce algorithm moves at least 2(N-1)/N of the buffer per rank on average.
    REQUIRE(sent_last_step >= 2 * (ranks - 1) * model_bytes);
  }
}

TEST_CASE("step stats: compute is the time between steps, and totals add up") {
  using clock = std::chrono::steady_clock;
  gw::one_device<gw::host_tensor<float>, gw::optim::sgd> s(make_params({64}), gw::optim::sgd({.lr = 0.1}));
  const auto grads = make_grads(make_params({64}), 0, 0);
  const auto before_first = clock::now();
  s.step(grads);
  const auto after_first = clock::now();
  const auto first = s.last_step_stats();
  // The caller's "forward and backward pass". It only makes the gap long next to a step;
  // what is asserted is measured around it: compute is the time from the end of one step to
  // the start of the next, so it lies between the gap seen from outside the two calls and
  // the time from the first call to the end of the second.
  std::this_thread::sleep_for(20ms);
  const auto before_second = clock::now();
  s.step(grads);
  const auto after_second = clock::now();
  const auto& last = s.last_step_stats();
  CAPTURE(last.compute.count(), last.in_step.count());
  REQUIRE(last.compute >= before_second - after_first);
  REQUIRE(last.compute <= after_second - before_first);
  REQUIRE(last.in_step <= after_second - before_second);
  REQUIRE(last.traffic.bytes_sent == 0);
  REQUIRE_FALSE(last.staleness.has_value());
  REQUIRE(s.cumulative_stats().steps == 2);
  REQUIRE(s.cumulative_stats().compute == first.compute + last.compute);
  REQUIRE(s.cumulative_stats().in_step == first.in_step + last.in_step);
  const std::string line = gw::observe::to_string(s.cumulative_stats());
  REQUIRE_THAT(line, Catch::StartsWith("2 steps: sent 0 MB/step") && Catch::Contains("compute"));
}

TEST_CASE("step stats: a parameter-server worker's staleness is what the server recorded for its gradients") {
  // The workers step in turns the test sets (0, 1, 2, 0, 1, 2, ...), so each gradient's
  // staleness follows from the async server's rule alone: the version is the least number
  // of gradients any worker has sent, and a gradient's staleness is the version when it
  // arrives less the version its worker last pulled. Worker 0 pulls (its k-th step) at
  // version k - 1 and pushes next at version k: 1 from its second step on; worker 1 alike;
  // worker 2, which completes each version, pulls at k and pushes at k: always 0.
  constexpr int workers = 3, steps = 12;
  std::mutex mutex;
  std::condition_variable turn_changed;
  int turn = 0;  // step k of worker w goes when turn == k * workers + w
  bool turn_missed = false;
  std::vector<std::vector<std::uint64_t>> reported(workers);  // per worker, per step
  gw::ps::server_stats server;
  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
    const int r = t.rank();
    gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::async> s(
        t, make_params({300, 5}), gw::optim::sgd({.lr = 0.05}), gw::aggregation::parameter_server<gw::ps::async>());
    if (s.is_server()) {
      server = s.serve();
      return;
    }
    if (r >= workers) throw std::logic_error("the workers are ranks 0.." + std::to_string(workers - 1));
    for (int k = 0; k < steps; ++k) {
      {
        std::unique_lock lock(mutex);
        if (!turn_changed.wait_for(lock, 30s, [&] { return turn == k * workers + r; })) {
          turn_missed = true;
          throw std::runtime_error("worker " + std::to_string(r) + " never got its turn");
        }
      }
      s.step(make_grads(make_params({300, 5}), r, k));
      if (!s.last_step_stats().staleness) throw std::logic_error("a worker's step reported no staleness");
      reported[r].push_back(*s.last_step_stats().staleness);
      {
        std::lock_guard lock(mutex);
        ++turn;
      }
      turn_changed.notify_all();
    }
    if (!s.cumulative_stats().staleness) throw std::logic_error("a worker's cumulative stats report no staleness");
  });
  REQUIRE_FALSE(turn_missed);
  std::vector<std::vector<std::uint64_t>> want(workers, std::vector<std::uint64_t>(steps, 1));
  want[0][0] = want[1][0] = 0;
  std::fill(want[2].begin(), want[2].end(), 0);
  REQUIRE(reported == want);
  // And the server's own histogram holds the same gradients: 2 + 12 of staleness 0, 22 of 1.
  std::map<std::uint64_t, std::uint64_t> recorded, from_workers;
  for (std::size_t k = 0; k < server.staleness.size(); ++k)
    if (server.staleness[k]) recorded[k] = server.staleness[k];
  for (const auto& w : reported)
    for (auto x : w) ++from_workers[x];
  REQUIRE(recorded == from_workers);
  REQUIRE(recorded == std::map<std::uint64_t, std::uint64_t>{{0, steps + 2}, {1, 2 * (steps - 1)}});
}

TEST_CASE("step stats: sync parameter servers report staleness 0") {
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync> s(t, make_params({40}),
                                                                              gw::optim::sgd({.lr = 0.05}));
    if (s.is_server()) {
      s.serve();
      return;
    }
    for (int k = 0; k < 4; ++k) {
      s.step(make_grads(make_params({40}), t.rank(), k));
      REQUIRE(s.last_step_stats().staleness == std::optional<std::uint64_t>(0));
      REQUIRE(s.last_step_stats().traffic.bytes_sent >= 40 * sizeof(float));
    }
  });
}

TEST_CASE("timeline: steps, buckets, collectives and optimizer steps, with bytes, per rank") {
  auto& timeline = gw::observe::timeline::global();
  const auto path = std::filesystem::temp_directory_path() / ("gradwire-test-timeline-" + std::to_string(::getpid()) + ".json");
  timeline.start(path);
  constexpr int ranks = 2, steps = 3;
  // Two tensors of 4 KiB in 4 KiB buckets: two buckets, reduced on the background thread.
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::inproc> s(
        t, make_params({1024, 1024}), gw::optim::sgd({.lr = 0.1}), gw::aggregation::all_reduce(4096));
    for (int k = 0; k < steps; ++k) s.step(make_grads(make_params({1024, 1024}), t.rank(), k));
  });
  timeline.stop();
  const auto events = timeline.events();
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    auto named = [&](const char* name) {
      std::vector<gw::observe::trace_event> out;
      for (const auto& e : events)
        if (e.rank == r && std::string(e.name) == name) out.push_back(e);
      return out;
    };
    const auto step_events = named("step"), buckets = named("bucket"), reductions = named("all_reduce"),
               updates = named("optimizer_step"), broadcasts = named("broadcast");
    REQUIRE(step_events.size() == steps);
    REQUIRE(buckets.size() == 2 * steps);
    REQUIRE(reductions.size() == 2 * steps);
    REQUIRE(updates.size() == 2 * steps);
    // Setup: one per tensor; after the first step, rank 0's gradient order (the buckets' rebuild).
    REQUIRE(broadcasts.size() == 3);
    for (const auto& b : buckets) {
      REQUIRE(b.bytes == 4096);
      REQUIRE(b.track == 1);  // the communicator's background thread
    }
    for (const auto& u : updates) {
      REQUIRE(u.bytes == 4096);
      REQUIRE(u.track == 0);
      // Every optimizer step lies inside one of the rank's steps.
      REQUIRE(std::any_of(step_events.begin(), step_events.end(), [&](const auto& s) {
        return s.begin_ns <= u.begin_ns && u.begin_ns + u.duration_ns <= s.begin_ns + s.duration_ns;
      }));
    }
    for (const auto& s : step_events) REQUIRE(s.bytes >= 2 * 4096);  // 2(N-1)/N of both buckets, at least
  }
  REQUIRE(timeline.write());
  const std::string first = read_file(path);
  REQUIRE_THAT(first, Catch::StartsWith("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n") &&
                          Catch::EndsWith("\n]}\n") && Catch::Contains("\"name\":\"rank 1 of 2\""));
  REQUIRE(count(first, "\"ph\":\"X\"") == events.size());
  // A second write (another process of the job, say) merges into the same document.
  timeline.start(path);
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    gw::mirrored<gw::host_tensor<float>, gw::optim::sgd> s(t, make_params({8}), gw::optim::sgd({.lr = 0.1}));
    s.step(make_grads(make_params({8}), t.rank(), 0));
  });
  timeline.stop();
  const std::size_t more = timeline.events().size();
  REQUIRE(more > 0);
  REQUIRE(timeline.write());
  const std::string merged = read_file(path);
  REQUIRE_THAT(merged, Catch::EndsWith("\n]}\n"));
  REQUIRE(count(merged, "\"ph\":\"X\"") == events.size() + more);
  REQUIRE(count(merged, "]}") == 1);
  std::filesystem::remove(path);
}

TEST_CASE("timeline: a file gone by the time it is written is reported with the reason, and write returns false") {
  // The trace's folder is removed between start (which checks the file opens) and write:
  // write cannot open the file, says so with the system's reason, and drops the events.
  auto& timeline = gw::observe::timeline::global();
  const auto dir = std::filesystem::temp_directory_path() / ("gradwire-test-timeline-gone-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "trace.json";
  timeline.start(path);
  REQUIRE(timeline.enabled());
  gw::observe::trace_event event;
  event.name = "step";
  event.begin_ns = timeline.now_ns();
  event.duration_ns = 1000;
  timeline.record(event);
  timeline.stop();
  std::filesystem::remove_all(dir);
  bool written = true;
  const std::string said = stderr_of([&] { written = timeline.write(); });
  CHECK_FALSE(written);
  CHECK_THAT(said, Catch::Contains("gradwire: timeline " + path.string() + ": cannot open and lock it (" +
                                   std::strerror(ENOENT) + ")"));
  CHECK(timeline.events().empty());
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("timeline: control characters in an event's texts are written as JSON escapes, quotes and backslashes escaped") {
  // A text with a tab, a newline, a quote and a backslash must come back from the file as
  // JSON that a trace viewer parses: \u0009, \u000a, \" and \\ (raw control characters are
  // not allowed inside a JSON string).
  auto& timeline = gw::observe::timeline::global();
  const auto path =
      std::filesystem::temp_directory_path() / ("gradwire-test-timeline-escapes-" + std::to_string(::getpid()) + ".json");
  timeline.start(path);
  gw::observe::trace_event event;
  event.name = "step";
  event.begin_ns = timeline.now_ns();
  event.duration_ns = 1000;
  event.args[0] = {"activity", "a\tb\nc\"d\\e", 0};
  timeline.record(event);
  timeline.stop();
  REQUIRE(timeline.write());
  const std::string written = read_file(path);
  CHECK_THAT(written, Catch::Contains("\"activity\":\"a\\u0009b\\u000ac\\\"d\\\\e\""));
  CHECK(written.find('\t') == std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("timeline: each step event carries its step number, 1 for the first step, in order") {
  // Step numbers on the timeline are 1-based (the first step is step 1), as the step
  // counters and GRADWIRE_LOG count them: a trace viewer's "step 3" is the third step.
  auto& timeline = gw::observe::timeline::global();
  const auto path =
      std::filesystem::temp_directory_path() / ("gradwire-test-timeline-steps-" + std::to_string(::getpid()) + ".json");
  timeline.start(path);
  constexpr int ranks = 2, steps = 4;
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::inproc> s(
        t, make_params({64, 7}), gw::optim::sgd({.lr = 0.1}));
    for (int k = 0; k < steps; ++k) s.step(make_grads(make_params({64, 7}), t.rank(), k));
  });
  timeline.stop();
  const auto events = timeline.events();
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    std::vector<gw::observe::trace_event> step_events;
    for (const auto& e : events)
      if (e.rank == r && std::string(e.name) == "step") step_events.push_back(e);
    std::sort(step_events.begin(), step_events.end(),
              [](const auto& a, const auto& b) { return a.begin_ns < b.begin_ns; });
    std::vector<std::int64_t> numbers;
    for (const auto& e : step_events) {
      std::optional<std::int64_t> number;
      for (const auto& a : e.args)
        if (a.key && std::string(a.key) == "step" && !a.text) number = a.number;
      REQUIRE(number.has_value());
      numbers.push_back(*number);
    }
    std::vector<std::int64_t> want;
    for (int k = 1; k <= steps; ++k) want.push_back(k);
    REQUIRE(numbers == want);
  }
  // The written trace says the same: each of steps 1..N once per rank, and no step 0.
  REQUIRE(timeline.write());
  const std::string written = read_file(path);
  REQUIRE(count(written, "events dropped") == 0);  // nothing was: no marker saying so
  REQUIRE(count(written, "\"step\":0") == 0);
  for (int k = 1; k <= steps; ++k) {
    CAPTURE(k);
    REQUIRE(count(written, "\"step\":" + std::to_string(k) + "}") == ranks);
  }
  std::filesystem::remove(path);
}

TEST_CASE("timeline: a path that cannot be written is reported, and nothing is recorded") {
  auto& timeline = gw::observe::timeline::global();
  const auto path = std::filesystem::temp_directory_path() / ("gradwire-test-timeline-ok-" + std::to_string(::getpid()));
  timeline.start(path);
  REQUIRE(timeline.enabled());
  timeline.start("/nonexistent-gradwire-dir/trace.json");
  REQUIRE_FALSE(timeline.enabled());
  std::filesystem::remove(path);
}

TEST_CASE("GRADWIRE_LOG: levels, and lines prefixed by rank") {
  using gw::observe::log_level;
  REQUIRE(gw::observe::detail::log_level_from("") == log_level::off);
  REQUIRE(gw::observe::detail::log_level_from("off") == log_level::off);
  REQUIRE(gw::observe::detail::log_level_from("info") == log_level::info);
  REQUIRE(gw::observe::detail::log_level_from("debug") == log_level::debug);
  REQUIRE(gw::observe::detail::log_level_from("loud") == log_level::info);  // and says so on stderr

  const auto path = std::filesystem::temp_directory_path() / ("gradwire-test-log-" + std::to_string(::getpid()));
  std::FILE* sink = std::fopen(path.c_str(), "w");
  REQUIRE(sink);
  gw::observe::set_log_sink(sink);
  auto train = [] {
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      gw::mirrored<gw::host_tensor<float>, gw::optim::sgd> s(t, make_params({16}), gw::optim::sgd({.lr = 0.1}));
      for (int k = 0; k < 2; ++k) s.step(make_grads(make_params({16}), t.rank(), k));
    });
  };
  gw::observe::set_log_level(log_level::off);
  train();
  std::fflush(sink);
  REQUIRE(read_file(path).empty());

  gw::observe::set_log_level(log_level::info);
  train();
  std::fflush(sink);
  const std::string info = read_file(path);
  gw::observe::set_log_level(log_level::debug);
  train();
  gw::observe::set_log_level(log_level::off);
  gw::observe::set_log_sink(nullptr);
  std::fclose(sink);
  const std::string all = read_file(path);
  std::filesystem::remove(path);

  for (const char* rank : {"[gradwire 0/2 +", "[gradwire 1/2 +"}) {
    CAPTURE(rank);
    REQUIRE(count(info, std::string(rank)) == 3);  // communicator, topology, strategy ready
    REQUIRE(count(info, std::string(rank)) == count(info, "\n") / 2);
  }
  REQUIRE_THAT(info, Catch::Contains("info: communicator over gradwire::transport::inproc") &&
                         Catch::Contains("info: topology: ") && Catch::Contains("info: strategy ready in") && !Catch::Contains("debug:"));
  const std::string debug = all.substr(info.size());
  REQUIRE(count(debug, "debug: step 1: 1 step: sent ") == 2);
  REQUIRE(count(debug, "debug: step 2: 1 step: sent ") == 2);
  REQUIRE(count(debug, "debug: all_reduce: 64 B in ") == 4);
}

namespace {
// A virtual clock that moves 2 ms at every reading: a traced region lasts exactly that.
struct stepping_clock final : gw::virtual_time {
  std::int64_t now = 0;
  std::int64_t now_ns() override { return now += 2'000'000; }
  std::int64_t run_in_background(void (*work)(void*), void* context) override {
    work(context);
    return now;
  }
  void advance_to(std::int64_t ns) override { now = std::max(now, ns); }
  void step_began() override {}
  void start_thread(void (*)(void*), void*) override { throw std::logic_error("stepping_clock: one thread"); }
  void join_thread() noexcept override {}
  void yield() override {}
  bool wait_signal(std::int64_t) override { return false; }
  void signal() override {}
  void waits_end_on_signal(bool) override {}
};
}  // namespace

TEST_CASE("GRADWIRE_LOG: a traced region's debug line gives its bytes, its duration in microseconds and its arguments") {
  const auto path = std::filesystem::temp_directory_path() / ("gradwire-test-trace-log-" + std::to_string(::getpid()));
  std::FILE* sink = std::fopen(path.c_str(), "w");
  REQUIRE(sink);
  gw::observe::set_log_sink(sink);
  gw::observe::set_log_level(gw::observe::log_level::debug);
  stepping_clock clock;
  {
    gw::observe::trace_scope scope(gw::time_source(clock), 1, 4, "push", "ps.worker", 4096);
    scope.arg("server", 3);
  }
  gw::observe::set_log_level(gw::observe::log_level::off);
  gw::observe::set_log_sink(nullptr);
  std::fclose(sink);
  const std::string text = read_file(path);
  std::filesystem::remove(path);
  // Begun at 2 ms, ended at 4 ms (virtual), logged at 6 ms.
  REQUIRE(text == "[gradwire 1/4 +0.006s virtual] debug: push: 4096 B in 2000.000 us server=3\n");
}
