// The cluster a plan prices: the simulator's model of it (transport/simulated/cluster_model.hpp), named in plan::.
//
// The planner and the simulator read one format and one type, so that a plan and a
// simulated run of it describe the same cluster: these are using-declarations of the
// simulator's own names, not copies (plan::cluster_model is simulation::cluster_model).
#pragma once

#include "../transport/simulated/cluster_model.hpp"

namespace gradwire::plan {

using simulation::cluster_model;
using simulation::compute_model;
using simulation::describe;
using simulation::duration;
using simulation::link_model;
using simulation::load_cluster_model;
using simulation::parse_cluster_model;
using simulation::rank_death;
using simulation::straggler_model;
using simulation::time_point;

}  // namespace gradwire::plan
