// Forwarding header: the simulated transport moved to transport/simulated.hpp (issue 36); include that.
//
// Kept so that code written against the old path compiles unchanged: the names were and are
// gradwire::simulation::{run, job, endpoint, compute, now, ...} and transport::simulated.
#pragma once

#include "../transport/simulated.hpp"
