// Forwarding header: the simulated transport moved to transport/simulated.hpp (issue 36); include that.
//
// Kept, with simulation/cluster_model.hpp and simulation/cost_model.hpp (the public paths),
// so that code written against them compiles unchanged: the names were and are
// gradwire::simulation::{run, job, endpoint, compute, now, ...} and transport::simulated.
// The inner headers (scheduler, mailbox, network, the cost models' pieces) moved without one.
#pragma once

#include "../transport/simulated.hpp"
