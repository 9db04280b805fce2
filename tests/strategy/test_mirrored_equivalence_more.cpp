// The mirrored-equivalence comparison notices replicas that train on the wrong samples, does
// not depend on which replica takes which slice, and holds over hierarchical all-reduce.
#include "mirrored_equivalence_support.hpp"

using namespace gradwire::test::mirrored_equivalence;

TEMPLATE_TEST_CASE("the equivalence check notices replicas that train on the wrong samples", "[strategy][mirrored]",
                   gradwire::optim::sgd, gradwire::optim::adam) {
  run_settings s;
  s.replicas = 3;
  const auto data = random_samples<float>(s.sizes, s.batch * s.replicas * s.steps, 99);
  const auto opt = make_optimizer<TestType>();
  const auto reference = train_one_device(s, data, opt);

  // Every replica on the first slice: a different gradient, which the check must see
  // (even against the loose float-Adam bound).
  const auto wrong = train_mirrored(s, data, opt,
                                    [&](int step, int) { return Eigen::Index(step) * s.batch * s.replicas; });
  const double error = max_relative_error(wrong[0], reference);
  CAPTURE(error);
  CHECK(error > 10 * 1e-3);
}

TEST_CASE("mirrored result does not depend on which replica takes which slice", "[strategy][mirrored]") {
  run_settings s;
  s.replicas = 2;
  const auto data = random_samples<float>(s.sizes, s.batch * s.replicas * s.steps, 98);
  const auto opt = make_optimizer<gradwire::optim::sgd>();
  const auto reference = train_one_device(s, data, opt);
  // Swapped slices: the same global batch, so the same result up to rounding.
  const auto swapped = train_mirrored(s, data, opt, [&](int step, int rank) {
    return Eigen::Index(step) * s.batch * s.replicas + Eigen::Index(s.replicas - 1 - rank) * s.batch;
  });
  const double error = max_relative_error(swapped[0], reference);
  CAPTURE(error);
  CHECK(error <= tolerance);
}

namespace {
// Hierarchical all-reduce with small buckets: several buckets in flight on the engine.
struct hierarchical_small_buckets : gradwire::aggregation::all_reduce_with<gradwire::collective::hierarchical> {
  hierarchical_small_buckets() : all_reduce_with(64 << 10) {}
};
}  // namespace

TEMPLATE_TEST_CASE("mirrored over hierarchical all-reduce on pretend hosts matches one_device with batch N*b",
                   "[strategy][mirrored][hierarchical]", gradwire::aggregation::all_reduce_with<gradwire::collective::hierarchical>,
                   hierarchical_small_buckets) {
  const std::vector<int> hosts = GENERATE(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 1, 2, 2, 2});
  run_settings s;
  s.replicas = static_cast<int>(hosts.size());
  CAPTURE(hosts);
  const auto data = random_samples<float>(s.sizes, s.batch * s.replicas * s.steps, 4321 + s.replicas);
  const auto opt = make_optimizer<gradwire::optim::sgd>();
  const auto reference = train_one_device(s, data, opt);
  const auto replicas = train_mirrored<float, gradwire::optim::sgd, TestType>(
      s, data, opt,
      [&](int step, int rank) { return Eigen::Index(step) * s.batch * s.replicas + Eigen::Index(rank) * s.batch; },
      gradwire::cluster::topology(hosts));
  const double error = max_relative_error(replicas[0], reference);
  CAPTURE(error);
  CHECK(error <= tolerance);
  for (std::size_t r = 1; r < replicas.size(); ++r)
    for (std::size_t t = 0; t < reference.size(); ++t)
      CHECK(std::memcmp(replicas[r][t].data(), replicas[0][t].data(), replicas[0][t].size() * sizeof(float)) == 0);
}
