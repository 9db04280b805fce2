// Explicit instantiations over inproc (threads of one process): declared here in compiled mode, defined once in src/core.cpp (collectives.hpp).
#pragma once

#include "../config.hpp"
#include "../transport/inproc.hpp"
#include "collectives.hpp"

#if !GRADWIRE_HEADER_ONLY
namespace gradwire {
GRADWIRE_COLLECTIVE_INSTANCES(extern template, transport::inproc)
}  // namespace gradwire
#endif
