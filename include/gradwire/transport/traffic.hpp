// transport::traffic_counters: the name transports (gradwire's and users') spell the counters by.
//
// They live in support/traffic.hpp so that concepts.hpp and observe/ need not include transport/.
#pragma once

#include "../support/traffic.hpp"

namespace gradwire::transport {
using support::traffic_counters;
}  // namespace gradwire::transport
