// Forwarding header: the cost models moved to plan/ (issue 36), namespace gradwire::plan; include plan/cost_model.hpp.
//
// Kept so that code written against the old path compiles unchanged: it brings the planner's
// names into gradwire::simulation, where they were (simulation::recommend,
// simulation::strategy_costs, simulation::predict_all_reduce, ...), with a using-directive
// rather than a list, so that no name is missed. simulation:: names its own first (qualified
// lookup looks through the directive only for a name simulation does not declare), and
// plan::cluster_model is the simulator's own type, so the two never disagree. New code
// writes plan::; detail:: names are not carried over.
#pragma once

#include "../plan/cost_model.hpp"
#include "../transport/simulated/cluster_model.hpp"

namespace gradwire::simulation {
using namespace gradwire::plan;
}  // namespace gradwire::simulation
