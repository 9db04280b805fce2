// support/waiting.hpp: the CPU facts every transport waits by, and the spin gate that
// learns whether polling hot before sleeping pays.
#include <catch2/catch.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include <gradwire/support/waiting.hpp>

namespace gw = gradwire;

namespace {
// How many waits in a row the gate keeps closed from now, then opens one (bounded).
unsigned closed_run(gw::support::spin_gate& gate) {
  unsigned closed = 0;
  while (!gate.open()) REQUIRE(++closed <= 1000);
  return closed;
}
}  // namespace

TEST_CASE("the spin gate is open until a window misses, then closed for 1, 2, 4 .. 64 waits") {
  gw::support::spin_gate gate;
  for (int i = 0; i < 10; ++i) {  // windows that pay keep it open
    REQUIRE(gate.open());
    gate.spun(true);
  }
  std::vector<unsigned> runs;
  for (int miss = 0; miss < 9; ++miss) {
    gate.spun(false);  // the window of the wait it let through ran out
    runs.push_back(closed_run(gate));
  }
  REQUIRE(runs == std::vector<unsigned>{1, 2, 4, 8, 16, 32, 64, 64, 64});
  REQUIRE(gate.misses_in_a_row() == 7);
}

TEST_CASE("a window that pays resets the spin gate: the next miss closes it for one wait only") {
  gw::support::spin_gate gate;
  for (int miss = 0; miss < 5; ++miss) {
    gate.spun(false);
    closed_run(gate);
  }
  gate.spun(true);
  REQUIRE(gate.misses_in_a_row() == 0);
  REQUIRE(gate.open());
  gate.spun(false);
  REQUIRE(closed_run(gate) == 1);
}

TEST_CASE("a CPU per rank counts the machine's CPUs, and usable CPUs the process's own") {
  const unsigned machine = std::max(1u, std::thread::hardware_concurrency());
  REQUIRE(gw::support::cpu_per_rank(static_cast<int>(machine)));
  REQUIRE_FALSE(gw::support::cpu_per_rank(static_cast<int>(machine) + 1));
  REQUIRE(gw::support::cpu_per_rank(-3));  // nonsense counts as one rank (not as 2^32 - 3)
#if defined(__linux__)
  // The affinity mask, read another way (the kernel's list in /proc), and then narrowed to
  // one CPU: usable_cpus follows the mask, not the machine.
  auto allowed_in_proc = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        unsigned count = 0;
        std::istringstream list(line.substr(line.find(':') + 1));
        std::string range;
        while (std::getline(list, range, ',')) {
          const auto dash = range.find('-');
          const unsigned first = static_cast<unsigned>(std::stoul(range));
          const unsigned last = dash == std::string::npos ? first : static_cast<unsigned>(std::stoul(range.substr(dash + 1)));
          count += last - first + 1;
        }
        return count;
      }
    return 0u;
  };
  const unsigned allowed = allowed_in_proc();
  REQUIRE(allowed >= 1);
  REQUIRE(gw::support::usable_cpus() == allowed);
  cpu_set_t original;
  REQUIRE(sched_getaffinity(0, sizeof original, &original) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &original)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  const unsigned narrowed = gw::support::usable_cpus(), narrowed_in_proc = allowed_in_proc();
  REQUIRE(sched_setaffinity(0, sizeof original, &original) == 0);
  REQUIRE(narrowed_in_proc == 1);
  REQUIRE(narrowed == 1);
  REQUIRE(gw::support::usable_cpus() == allowed);
#endif
}
