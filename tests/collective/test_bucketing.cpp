// Bucket planning and bucketed all-reduce: same result as reducing each tensor alone.
#include <catch2/catch.hpp>

#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/bucketing.hpp>
#include <gradwire/transport/inproc.hpp>
#include <vector>

#include "collective_support.hpp"

namespace gw = gradwire;
using gw::collective::bucket;
using namespace std::chrono_literals;

namespace {

// Sizes of `count` tensors: mostly small, some empty, some larger than `budget_elements`.
std::vector<std::size_t> mixed_sizes(std::mt19937_64& gen, std::size_t count, std::size_t budget_elements) {
  std::vector<std::size_t> sizes(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto kind = gen() % 10;
    sizes[i] = kind == 0   ? 0
               : kind == 1 ? budget_elements + 1 + gen() % (2 * budget_elements)
                           : 1 + gen() % (budget_elements / 3);
  }
  sizes[0] = 0;                      // an empty tensor first
  sizes[1] = 3 * budget_elements;    // a big one early
  sizes[count - 1] = 0;              // and an empty one last
  return sizes;
}

void check_plan(const std::vector<std::size_t>& sizes, std::size_t element_bytes, std::size_t budget) {
  std::vector<bucket> plan;
  gw::collective::plan_buckets(sizes, element_bytes, budget, plan);
  REQUIRE(!plan.empty());
  std::size_t next_tensor = 0, next_offset = 0;
  for (const bucket& b : plan) {
    // In order, contiguous, every tensor in exactly one bucket.
    REQUIRE(b.first_tensor == next_tensor);
    REQUIRE(b.offset == next_offset);
    REQUIRE(b.end_tensor > b.first_tensor);
    std::size_t count = 0, nonempty = 0;
    for (std::size_t i = b.first_tensor; i < b.end_tensor; ++i) count += sizes[i], nonempty += sizes[i] > 0;
    REQUIRE(b.count == count);
    // Within the budget, unless it is one tensor that alone exceeds it.
    if (count * element_bytes > budget) REQUIRE(nonempty == 1);
    next_tensor = b.end_tensor;
    next_offset += b.count;
  }
  REQUIRE(next_tensor == sizes.size());
  // Greedy: a bucket closes only when the next non-empty tensor would not fit.
  for (std::size_t k = 0; k + 1 < plan.size(); ++k) {
    std::size_t first_next = plan[k + 1].first_tensor;
    while (sizes[first_next] == 0) ++first_next;
    REQUIRE((plan[k].count + sizes[first_next]) * element_bytes > budget);
  }
}

}  // namespace

TEST_CASE("plan_buckets packs tensors in order within the budget") {
  SECTION("a worked example") {
    // budget 16 floats: [0, 10, 6] fits; 1 does not; 40 alone; [0 rides along]; [3, 3].
    const std::vector<std::size_t> sizes{0, 10, 6, 1, 40, 0, 3, 3};
    std::vector<bucket> plan;
    gw::collective::plan_buckets(sizes, sizeof(float), 64, plan);
    REQUIRE(plan.size() == 4);
    REQUIRE((plan[0].first_tensor == 0 && plan[0].end_tensor == 3 && plan[0].offset == 0 && plan[0].count == 16));
    REQUIRE((plan[1].first_tensor == 3 && plan[1].end_tensor == 4 && plan[1].offset == 16 && plan[1].count == 1));
    REQUIRE((plan[2].first_tensor == 4 && plan[2].end_tensor == 6 && plan[2].offset == 17 && plan[2].count == 40));
    REQUIRE((plan[3].first_tensor == 6 && plan[3].end_tensor == 8 && plan[3].offset == 57 && plan[3].count == 6));
  }
  SECTION("random mixes of sizes") {
    GRADWIRE_TEST_RNG(rng);
    for (int round = 0; round < 20; ++round) check_plan(mixed_sizes(rng.engine(), 50, 256), sizeof(double), 256 * 8);
  }
  SECTION("edge cases") {
    std::vector<bucket> plan;
    gw::collective::plan_buckets({}, 4, 64, plan);
    REQUIRE(plan.empty());
    const std::vector<std::size_t> empties{0, 0, 0};
    gw::collective::plan_buckets(empties, 4, 64, plan);
    REQUIRE(plan.size() == 1);
    REQUIRE((plan[0].end_tensor == 3 && plan[0].count == 0));
    REQUIRE_THROWS_MATCHES(gw::collective::plan_buckets(empties, 4, 0, plan), gw::error,
                           gw::test::is_error(gw::errc::invalid_argument, {"budget"}));
  }
}

TEMPLATE_TEST_CASE("bucketed all-reduce of 50 mixed tensors equals reducing each tensor alone", "[collective]", float,
                   double) {
  using V = TestType;
  const int ranks = GENERATE(1, 2, 3, 4);
  GRADWIRE_TEST_RNG(rng);
  constexpr std::size_t budget_bytes = 4096;
  const auto sizes = mixed_sizes(rng.engine(), 50, budget_bytes / sizeof(V));
  CAPTURE(ranks);
  // Small integers: every summation order gives the exact sum, so bucketed and per-tensor
  // results must agree bit for bit whatever chunk each element lands in.
  std::vector<std::vector<std::vector<V>>> bucketed(ranks), alone(ranks), random(ranks);  // [rank][tensor]
  for (int r = 0; r < ranks; ++r)
    for (std::size_t s : sizes) {
      std::vector<V> t(s), u(s);
      for (std::size_t i = 0; i < s; ++i) t[i] = static_cast<V>(rng.integer<int>(-1000, 1000)), u[i] = rng.value<V>(-1, 1);
      bucketed[r].push_back(t);
      alone[r].push_back(t);
      random[r].push_back(u);
    }
  std::vector<std::vector<std::vector<double>>> expected(sizes.size());  // [tensor] -> reference
  std::vector<std::vector<double>> expected_random(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::vector<V>> per_rank, per_rank_random;
    for (int r = 0; r < ranks; ++r) per_rank.push_back(bucketed[r][k]), per_rank_random.push_back(random[r][k]);
    expected[k] = {gw::test::serial_reduce(per_rank, false)};
    expected_random[k] = gw::test::serial_reduce(per_rank_random, false);
  }

  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    gw::collective::communicator comm(t, {.timeout = 60s});
    gw::collective::bucket_buffer buffer(budget_bytes);
    for (auto* tensors : {&bucketed[me], &random[me]}) {
      std::vector<std::span<V>> spans(tensors->begin(), tensors->end());
      gw::collective::bucketed_all_reduce(comm, std::span<const std::span<V>>(spans), buffer);
    }
    gw::test::expect(buffer.buckets().size() > 5, "it really did bucket");
    for (auto& tensor : alone[me]) gw::collective::all_reduce(comm, std::span<V>(tensor));
  });
  for (int r = 0; r < ranks; ++r)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      CAPTURE(r, k, sizes[k]);
      REQUIRE(bucketed[r][k] == alone[r][k]);
      REQUIRE(gw::test::count_wrong(bucketed[r][k], expected[k][0], 0.0) == 0);
      REQUIRE(gw::test::count_wrong(random[r][k], expected_random[k], gw::test::sum_tolerance<V>(ranks)) == 0);
      REQUIRE(random[r][k] == random[0][k]);  // bit-identical across ranks
    }
}

TEST_CASE("a bucket_buffer plans again when the tensors change and reuses its plan otherwise") {
  gw::collective::bucket_buffer buffer(64);
  std::vector<float> a(10), b(10), c(3);
  std::vector<std::span<float>> two{a, b}, three{a, b, c};
  REQUIRE(buffer.plan<float>(two).size() == 2);
  const bucket* first = buffer.buckets().data();
  REQUIRE(buffer.plan<float>(two).data() == first);  // same sizes: same plan
  REQUIRE(buffer.plan<float>(three).size() == 2);    // c joins b's bucket
  REQUIRE(buffer.buckets()[1].end_tensor == 3);
  REQUIRE(buffer.plan<double>(three).size() == 3);  // twice the bytes per element
}
