// The paths and spellings from before issue 36 split simulation/ (transport/simulated/ and plan/) still compile and mean the same.
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>
#include <vector>

#include <gradwire/plan/cost_model.hpp>
#include <gradwire/simulation/cluster_model.hpp>
#include <gradwire/simulation/cost_model.hpp>
#include <gradwire/simulation/transport.hpp>

namespace sim = gradwire::simulation;
namespace plan = gradwire::plan;

// One type, not a copy: a cluster_model read for the simulator is the planner's input.
static_assert(std::is_same_v<sim::cluster_model, plan::cluster_model>);
static_assert(std::is_same_v<sim::compute_model, plan::compute_model>);
// The planner's names answer to simulation:: through <gradwire/simulation/cost_model.hpp>.
static_assert(std::is_same_v<sim::strategy_costs, plan::strategy_costs>);
static_assert(std::is_same_v<sim::all_reduce_algorithm, plan::all_reduce_algorithm>);
static_assert(std::is_same_v<sim::recommendation, plan::recommendation>);
static_assert(sim::default_monte_carlo_trials == plan::default_monte_carlo_trials);
// And the endpoint is transport::simulated, as it was.
static_assert(std::is_same_v<gradwire::transport::simulated, sim::endpoint>);

TEST_CASE("the simulation:: spellings of the planner call the plan:: functions") {
  const sim::cluster_model c = sim::parse_cluster_model("hosts=2 ranks_per_host=2 bandwidth=1Gbit");
  const auto old = sim::predict_all_reduce(c, sim::all_reduce_algorithm::auto_, 100000);
  const auto now = plan::predict_all_reduce(c, plan::all_reduce_algorithm::auto_, 100000);
  CHECK(old.seconds == now.seconds);
  CHECK(old.runs == now.runs);
  CHECK(std::string(sim::name_of(old.runs)) == plan::name_of(now.runs));
  CHECK(sim::describe(sim::with_servers(c, 1)) == plan::describe(plan::with_servers(c, 1)));
  const sim::strategy_costs costs(c, {235146, {}, 8, 1e-3, {}});
  const std::vector<sim::strategy_cost> all{costs.all_reduce(sim::all_reduce_algorithm::ring), costs.ps_sync(1)};
  CHECK(sim::recommend(all).best == plan::recommend(all).best);
}
