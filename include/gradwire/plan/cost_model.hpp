// The analytic cost models: every all-reduce algorithm and strategy priced on a cluster_model, and which to choose.
//
// Pieces (each its own header): link_cost.hpp prices a round of messages (alpha-beta with
// link contention, as the simulator's FIFO links see it); all_reduce_cost.hpp and
// rooted_cost.hpp write the collectives as their rounds; straggler_statistics.hpp gives
// the expected order statistics of compute under the straggler model; strategy_cost.hpp
// puts them together per strategy. recommend() below picks the fastest. These are
// predictions for the simulator (transport/simulated.hpp) to check, and for the planner
// (examples/plan); docs/planning.md has the formulas and their limits. Namespace
// gradwire::plan (cluster_model.hpp names the simulator's cluster model in it); the old
// <gradwire/simulation/cost_model.hpp> still spells these simulation::.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>

#include "all_reduce_cost.hpp"
#include "cluster_model.hpp"
#include "link_cost.hpp"
#include "rooted_cost.hpp"
#include "schedule.hpp"
#include "straggler_statistics.hpp"
#include "strategy_cost.hpp"

namespace gradwire::plan {

// Which strategy to run, and why in one line.
struct recommendation {
  std::size_t best = 0;              // the most samples per second
  std::size_t best_synchronous = 0;  // the most among synchronous ones (== best when best is)
  bool any_synchronous = false;
  std::string reason;  // "<best>: ... samples/s, ...x <runner-up>; communication ...% of its step"
  std::string caveat;  // what the choice trades, and where to look further
};

namespace detail {
inline std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}
}  // namespace detail

// The fastest predicted time per sample (most samples/s) among the available strategies,
// with the runner-up for scale. Strategies that are not synchronous (async, stale, local
// SGD) make more samples per second but less progress per sample, which the analytic
// model does not see: then the caveat names the best synchronous strategy too and points
// to the simulator (plan --simulate) for time to accuracy.
inline recommendation recommend(std::span<const strategy_cost> costs) {
  auto faster = [&](std::size_t a, std::size_t b) {
    return costs[a].available && (!costs[b].available || costs[a].samples_per_second > costs[b].samples_per_second);
  };
  bool any = false;
  for (const auto& c : costs) any = any || c.available;
  if (!any) throw error(errc::invalid_argument, "recommend: no available strategy to choose from");
  recommendation r;
  for (std::size_t i = 1; i < costs.size(); ++i)
    if (faster(i, r.best)) r.best = i;
  bool found = false;
  for (std::size_t i = 0; i < costs.size(); ++i)
    if (costs[i].synchronous && costs[i].available && (!found || faster(i, r.best_synchronous)))
      r.best_synchronous = i, found = true;
  r.any_synchronous = found;

  const strategy_cost& b = costs[r.best];
  std::size_t second = costs.size();
  for (std::size_t i = 0; i < costs.size(); ++i)
    if (i != r.best && costs[i].available && (second == costs.size() || faster(i, second))) second = i;
  r.reason = b.name + ": " + detail::fixed(b.samples_per_second, 0) + " samples/s, a step of " +
             detail::fixed(b.step * 1e3, 3) + " ms (compute " + detail::fixed(b.compute * 1e3, 3) + " + communication " +
             detail::fixed(b.communication * 1e3, 3) + ")";
  if (second < costs.size() && costs[second].samples_per_second > 0)
    r.reason += ", " + detail::fixed(b.samples_per_second / costs[second].samples_per_second, 2) + "x " +
                costs[second].name;
  if (b.step > 0)
    r.reason += "; communication is " + detail::fixed(100 * b.communication / b.step, 0) + "% of its step";

  if (!b.synchronous) {
    r.caveat = b.name + " trades statistical efficiency for speed (stale or averaged updates need more steps), which "
                        "this model does not see";
    if (found)
      r.caveat += "; the fastest synchronous choice is " + costs[r.best_synchronous].name + " (" +
                  detail::fixed(costs[r.best_synchronous].samples_per_second, 0) + " samples/s)";
    r.caveat += ". Run plan --simulate to compare time to accuracy.";
  } else {
    r.caveat = "synchronous: the same updates as one process with the combined batch. Asynchronous and local-SGD rows "
               "trade statistical efficiency this model does not see; plan --simulate measures time to accuracy.";
  }
  return r;
}

}  // namespace gradwire::plan
