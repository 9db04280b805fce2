// Broadcast from every root and the barrier's one guarantee: nobody leaves before all arrive.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <gradwire/transport/inproc.hpp>
#include <random>
#include <thread>
#include <vector>

namespace gw = gradwire;

TEST_CASE("broadcast copies the root's buffer to every rank, for every root") {
  const int ranks = GENERATE(range(1, 9));
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 100003);
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
  REQUIRE_THROWS_WITH(gw::collective::broadcast(comm, std::span<float>(v), 1), Catch::Contains("root 1"));
}

TEST_CASE("no rank leaves a barrier before every rank has entered it") {
  const int ranks = GENERATE(2, 3, 5, 8);
  CAPTURE(ranks);
  std::atomic<int> entered{0};
  std::atomic<int> early_leavers{0};
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    gw::collective::communicator comm(t, {.timeout = std::chrono::seconds(60)});
    for (int round = 1; round <= 3; ++round) {
      // Stagger arrivals so a broken barrier would let early ranks through.
      std::this_thread::sleep_for(std::chrono::milliseconds(((t.rank() * 7 + round) % ranks) * 3));
      entered.fetch_add(1);
      gw::collective::barrier(comm);
      if (entered.load() < round * ranks) early_leavers.fetch_add(1);
      gw::collective::barrier(comm);  // keep rounds apart
    }
  });
  REQUIRE(entered.load() == 3 * ranks);
  REQUIRE(early_leavers.load() == 0);
}
