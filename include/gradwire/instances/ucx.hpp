// Explicit instantiations over ucx: declared here in compiled mode, defined once in src/ucx.cpp (collectives.hpp).
#pragma once

#include "../config.hpp"
#include "../transport/ucx.hpp"
#include "collectives.hpp"

#if !GRADWIRE_HEADER_ONLY
namespace gradwire {
GRADWIRE_COLLECTIVE_INSTANCES(extern template, transport::ucx)
}  // namespace gradwire
#endif
