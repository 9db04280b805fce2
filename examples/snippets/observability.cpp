// docs/observability.md's code: per-step stats added up over a window of steps, and a
// timeline started from code; checked against what the transport counted.
#include <gradwire/gradwire.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

namespace gw = gradwire;

int main() {
  constexpr int replicas = 2, steps = 4;
  const auto trace = std::filesystem::temp_directory_path() / ("gradwire-snippet-" + std::to_string(::getpid()) + ".json");
  // [docs:timeline]
  gw::observe::timeline::global().start(trace);  // as GRADWIRE_TIMELINE=trace does
  // [/docs:timeline]
  std::mutex mutex;
  std::vector<gw::observe::step_stats> windows(replicas), totals(replicas);
  gw::transport::run_inproc(replicas, [&](gw::transport::inproc transport) {
    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{256, 4});
    params.emplace_back(gw::shape{256});
    gw::mirrored<gw::host_tensor<float>, gw::optim::sgd> strategy(std::move(transport), std::move(params),
                                                                  gw::optim::sgd({.lr = 0.1}));
    std::vector<std::vector<float>> grads{std::vector<float>(1024, 0.01f), std::vector<float>(256, 0.02f)};
    // [docs:epoch_stats]
    gw::observe::step_stats window;  // e.g. one epoch
    for (int step = 0; step < steps; ++step) {
      strategy.step(grads);
      window += strategy.last_step_stats();
    }
    if (strategy.rank() == 0) std::printf("rank 0: %s\n", gw::observe::to_string(window).c_str());
    // [/docs:epoch_stats]
    std::lock_guard lock(mutex);
    windows[strategy.rank()] = window;
    totals[strategy.rank()] = strategy.cumulative_stats();
  });
  // [docs:timeline_write]
  gw::observe::write_timeline();  // also done at exit
  // [/docs:timeline_write]

  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) std::fprintf(stderr, "observability snippet: FAILED: %s\n", what.c_str()), ++failures;
  };
  const std::uint64_t model_bytes = (1024 + 256) * sizeof(float);
  std::uint64_t sent = 0, received = 0;
  for (int r = 0; r < replicas; ++r) {
    check(windows[r].steps == steps, "the window holds every step");
    check(windows[r].traffic == totals[r].traffic, "the window's bytes are the strategy's totals");
    check(windows[r].in_step >= windows[r].optimizer, "optimizer time is part of the step");
    sent += windows[r].traffic.bytes_sent;
    received += windows[r].traffic.bytes_received;
  }
  check(sent == received, "what the ranks sent, they received");
  check(sent >= steps * 2 * (replicas - 1) * model_bytes, "an all-reduce moves 2(N-1)/N of the gradient per rank");
  std::ifstream in(trace);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(json.find("\"name\":\"step\"") != std::string::npos && json.find("\"name\":\"all_reduce\"") != std::string::npos,
        "the timeline holds the steps and their all-reduces");
  std::filesystem::remove(trace);
  return failures == 0 ? 0 : 1;
}
