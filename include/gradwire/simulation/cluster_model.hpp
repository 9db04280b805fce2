// Forwarding header: the cluster model moved to transport/simulated/cluster_model.hpp (issue 36); include that.
//
// Kept so that code written against the old path compiles unchanged: the names were and are
// gradwire::simulation::{cluster_model, parse_cluster_model, describe, ...}.
#pragma once

#include "../transport/simulated/cluster_model.hpp"
