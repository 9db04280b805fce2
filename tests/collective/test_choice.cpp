// The rules that choose a collective's algorithm (collective/choice.hpp), against the rules written out again as documented.
//
// The collectives and the cost models both call these functions; that they run what the
// rule says is checked where they run: the auto_ tests of test_collective_one_shot,
// _hierarchical_all_reduce, _halving_doubling, _ring_all_reduce and _reduce (inproc), and
// test_cost_model's "the planner's auto_ takes the algorithm all_reduce<auto_> runs" and
// "the planner's reduce takes the algorithm reduce runs" (the simulator).
#include <catch2/catch.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include <gradwire/collective/choice.hpp>
#include <gradwire/support/topology.hpp>

namespace col = gradwire::collective;
using col::algorithm_id;

namespace {

constexpr std::size_t KiB = 1024;

// all_reduce<auto_>'s rule as docs/topology.md and communicator_options word it, with the
// library's limits as numbers (one-shot on at most 8 ranks; the call check's frame carries
// 64 bytes), so that changing one of them fails here.
algorithm_id documented_all_reduce(int ranks, int hosts, int most_ranks_on_a_host, std::size_t bytes,
                                   const col::communicator_options& o, bool one_shot_possible) {
  const bool one_host = hosts == 1;
  const bool some_host_shared = most_ranks_on_a_host >= 2;
  if (one_shot_possible && ranks >= 2 && ranks <= 8) {
    const std::size_t copies_sent = bytes * std::size_t(ranks - 1);  // to every other rank
    if (one_host && copies_sent <= o.one_shot_max_sent_bytes) return algorithm_id::one_shot;
    if (!one_host && bytes <= 64) return algorithm_id::one_shot;  // inside the call check's frame
  }
  if (!one_host && some_host_shared && bytes >= o.hierarchical_min_bytes) return algorithm_id::hierarchical;
  if (bytes < o.small_all_reduce_bytes) return algorithm_id::halving_doubling;
  return algorithm_id::ring;
}

// The inputs all_reduce<auto_> passes for a topology (collective/all_reduce.hpp).
col::all_reduce_inputs inputs_of(const gradwire::cluster::topology& t, std::size_t bytes, bool one_shot_possible) {
  return {.ranks = t.size(),
          .hosts = t.host_count(),
          .most_ranks_on_a_host = t.max_local_size(),
          .bytes = bytes,
          .one_shot_possible = one_shot_possible};
}

// Every byte count where the rule may turn for `ranks` ranks under `o`: 0, 1, each limit
// (the check frame's, one-shot's per-rank share, hierarchical's, halving-doubling's) minus
// one, at and plus one, and a large buffer.
std::vector<std::size_t> edges(int ranks, const col::communicator_options& o) {
  std::vector<std::size_t> limits{col::check_inline_bytes, o.hierarchical_min_bytes, o.small_all_reduce_bytes};
  if (ranks >= 2) limits.push_back(o.one_shot_max_sent_bytes / std::size_t(ranks - 1));
  std::vector<std::size_t> bytes{0, 1, std::size_t{1} << 30};
  for (const std::size_t at : limits)
    for (const std::size_t b : {at - 1, at, at + 1})
      if (at > 0 || b == at) bytes.push_back(b);
  return bytes;
}

}  // namespace

TEST_CASE("auto_'s all-reduce choice follows the documented rule for 1..16 ranks on 1, 2 and 4 hosts, on both sides of every limit") {
  const std::vector<col::communicator_options> options{
      {},  // the defaults
      {.one_shot_max_sent_bytes = 0, .small_all_reduce_bytes = 1000, .hierarchical_min_bytes = 4096},  // hierarchical above HD's limit
      {.one_shot_max_sent_bytes = 3 * KiB, .small_all_reduce_bytes = 8 * KiB, .hierarchical_min_bytes = 0},
  };
  int checked = 0;
  for (const auto& o : options)
    for (const int ranks : {1, 2, 3, 4, 8, 9, 16})
      for (const int hosts : {1, 2, 4}) {
        if (hosts > ranks) continue;
        // Host-major (ranks 0..k on host 0) and interleaved (rank r on host r % hosts); uneven
        // where hosts do not divide the ranks (3 on 2 hosts: 2 and 1).
        for (const bool interleaved : {false, true}) {
          std::vector<int> labels(static_cast<std::size_t>(ranks));
          for (int r = 0; r < ranks; ++r)
            labels[static_cast<std::size_t>(r)] = interleaved ? r % hosts : r * hosts / ranks;
          const gradwire::cluster::topology layout(labels);
          REQUIRE(layout.host_count() == hosts);
          for (const std::size_t bytes : edges(ranks, o))
            for (const bool one_shot_possible : {true, false}) {
              CAPTURE(ranks, hosts, interleaved, layout.max_local_size(), bytes, one_shot_possible, o.one_shot_max_sent_bytes,
                      o.small_all_reduce_bytes, o.hierarchical_min_bytes);
              const algorithm_id expected =
                  documented_all_reduce(ranks, hosts, layout.max_local_size(), bytes, o, one_shot_possible);
              CHECK(name_of(col::choose_all_reduce(inputs_of(layout, bytes, one_shot_possible), o)) ==
                    std::string(name_of(expected)));
              ++checked;
            }
        }
      }
  CHECK(checked > 1000);
}

TEST_CASE("auto_'s all-reduce choice at points checked by hand") {
  const col::communicator_options d;  // one-shot to 64 KiB sent, hierarchical from 64 KiB, the ring from 128 KiB
  auto choose = [&](int ranks, int hosts, int most, std::size_t bytes) {
    return std::string(name_of(col::choose_all_reduce(
        {.ranks = ranks, .hosts = hosts, .most_ranks_on_a_host = most, .bytes = bytes}, d)));
  };
  // One host of 4: 3 copies of 4000 B fit 64 KiB, 3 of 32000 do not.
  CHECK(choose(4, 1, 4, 4000) == "one_shot");
  CHECK(choose(4, 1, 4, 32000) == "halving_doubling");
  CHECK(choose(4, 1, 4, 128 * KiB - 1) == "halving_doubling");
  CHECK(choose(4, 1, 4, 128 * KiB) == "ring");
  // 2 ranks: one copy of up to 64 KiB.
  CHECK(choose(2, 1, 2, 64 * KiB) == "one_shot");
  CHECK(choose(2, 1, 2, 64 * KiB + 1) == "halving_doubling");
  // 8 ranks take one-shot, 9 do not.
  CHECK(choose(8, 1, 8, 8) == "one_shot");
  CHECK(choose(9, 1, 9, 8) == "halving_doubling");
  // 2 hosts of 2: across hosts one-shot only within the check frame, hierarchical from 64 KiB.
  CHECK(choose(4, 2, 2, 64) == "one_shot");
  CHECK(choose(4, 2, 2, 65) == "halving_doubling");
  CHECK(choose(4, 2, 2, 64 * KiB - 1) == "halving_doubling");
  CHECK(choose(4, 2, 2, 64 * KiB) == "hierarchical");
  CHECK(choose(4, 2, 2, 1 << 30) == "hierarchical");
  // One rank per host: no hierarchy, the flat choices.
  CHECK(choose(16, 16, 1, 64 * KiB) == "halving_doubling");
  CHECK(choose(16, 16, 1, 1 << 20) == "ring");
  // One rank: nothing to send; the rule still answers by size.
  CHECK(choose(1, 1, 1, 8) == "halving_doubling");
  // A transport whose requests cannot wait in an array never takes one-shot.
  CHECK(name_of(col::choose_all_reduce({.ranks = 2, .most_ranks_on_a_host = 2, .bytes = 8, .one_shot_possible = false},
                                       d)) == std::string("halving_doubling"));
}

TEST_CASE("hierarchical runs the flat ring without a hierarchy or without data") {
  for (const bool hierarchy : {false, true})
    for (const std::size_t elements : {std::size_t{0}, std::size_t{1}, std::size_t{1} << 30}) {
      CAPTURE(hierarchy, elements);
      CHECK(col::hierarchical_runs_flat_ring(hierarchy, elements) == (!hierarchy || elements == 0));
    }
  using gradwire::cluster::topology;
  CHECK_FALSE(topology::spans_hosts_with_shared_host(1, 4));  // one host
  CHECK_FALSE(topology::spans_hosts_with_shared_host(4, 1));  // one rank per host
  CHECK(topology::spans_hosts_with_shared_host(2, 2));
  CHECK(topology({0, 1, 1}).spans_hosts_with_shared_host());  // uneven: some host has two
}

TEST_CASE("reduce takes the tree on 1 or 2 ranks and below small_all_reduce_bytes, scatter-gather from it on") {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  for (const std::size_t threshold : {col::communicator_options{}.small_all_reduce_bytes, std::size_t{1}, std::size_t{0}, none})
    for (const int ranks : {1, 2, 3, 4, 8, 9, 16})
      for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, threshold - 1, threshold, threshold + 1, std::size_t{1} << 30}) {
        CAPTURE(threshold, ranks, bytes);
        const bool tree = ranks == 1 || ranks == 2 || bytes < threshold;  // docs: the tree moves no more on 2
        CHECK(col::reduce_takes_tree(ranks, bytes, threshold) == tree);
      }
  const std::size_t d = col::communicator_options{}.small_all_reduce_bytes;  // 128 KiB
  CHECK(col::reduce_takes_tree(3, 128 * KiB - 1, d));
  CHECK_FALSE(col::reduce_takes_tree(3, 128 * KiB, d));
  CHECK(col::reduce_takes_tree(2, 1 << 30, d));
}
