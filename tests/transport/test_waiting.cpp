// support/waiting.hpp: the CPU facts every transport waits by, and the spin gate that
// learns whether polling hot before sleeping pays.
#include <catch2/catch.hpp>
#include <algorithm>
#include <thread>
#include <vector>

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

TEST_CASE("a CPU per rank counts the machine's CPUs; usable CPUs the process's own") {
  const unsigned machine = std::max(1u, std::thread::hardware_concurrency());
  REQUIRE(gw::support::cpu_per_rank(1));
  REQUIRE(gw::support::cpu_per_rank(0));  // nonsense counts as one rank
  REQUIRE(gw::support::cpu_per_rank(static_cast<int>(machine)));
  REQUIRE_FALSE(gw::support::cpu_per_rank(static_cast<int>(machine) + 1));
  REQUIRE(gw::support::usable_cpus() >= 1);
  REQUIRE(gw::support::usable_cpus() <= machine);
}
