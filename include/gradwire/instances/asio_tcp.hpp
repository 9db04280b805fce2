// Explicit instantiations over asio_tcp: declared here in compiled mode, defined once in src/asio.cpp (collectives.hpp).
#pragma once

#include "../config.hpp"
#include "../transport/asio_tcp.hpp"
#include "collectives.hpp"

#if !GRADWIRE_HEADER_ONLY
namespace gradwire {
GRADWIRE_COLLECTIVE_INSTANCES(extern template, transport::asio_tcp)
}  // namespace gradwire
#endif
