// The clock every deadline is measured on, and the deadline type: below everything, so any header may name them.
#pragma once

#include <chrono>

namespace gradwire {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

}  // namespace gradwire
