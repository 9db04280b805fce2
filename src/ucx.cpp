// gradwire::ucx's compiled runtime: the UCX transport's engine, joining over UCX, and the collectives
// over ucx for float and double (instances/collectives.hpp), compiled
// once for every program that links the component (config.hpp; docs/building.md).
// Header-only builds do not use this file.
#include <gradwire/config.hpp>
#if GRADWIRE_HEADER_ONLY
#error "src/ucx.cpp is the compiled runtime: build it with GRADWIRE_SEPARATE_COMPILATION (CMake does)"
#endif

#include <gradwire/cluster/ucx.ipp>
#include <gradwire/transport/ucx.hpp>
#include <gradwire/transport/ucx/control.ipp>
#include <gradwire/transport/ucx/failure.ipp>
#include <gradwire/transport/ucx/join.ipp>
#include <gradwire/transport/ucx/one_sided.ipp>
#include <gradwire/transport/ucx/receive.ipp>
#include <gradwire/transport/ucx/rejoin.ipp>
#include <gradwire/transport/ucx/send.ipp>
#include <gradwire/transport/ucx/wait.ipp>
#include <gradwire/transport/ucx/watch.ipp>
#include <gradwire/transport/ucx/worker.ipp>

#include <gradwire/instances/ucx.hpp>

namespace gradwire {
GRADWIRE_COLLECTIVE_INSTANCES(template, transport::ucx)
}  // namespace gradwire
