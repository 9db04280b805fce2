// gradwire::asio's compiled runtime: the TCP transport's engine, the rendezvous store, cluster
// detection (the launchers' variables, TF_CONFIG over nlohmann-json), and
// Boost.Asio's own non-template code, compiled once for every program that links the
// component (config.hpp; docs/building.md). Header-only builds do not use this file.
#include <gradwire/config.hpp>
#if GRADWIRE_HEADER_ONLY
#error "src/asio.cpp is the compiled runtime: build it with GRADWIRE_SEPARATE_COMPILATION (CMake does)"
#endif

#include <boost/asio/impl/src.hpp>  // Boost.Asio's separate compilation (BOOST_ASIO_SEPARATE_COMPILATION)

#include <gradwire/cluster/spec.ipp>
#include <gradwire/cluster/tcp.ipp>
#include <gradwire/cluster/tf_config.ipp>
#include <gradwire/rendezvous/store.ipp>
#include <gradwire/transport/asio_tcp.hpp>
#include <gradwire/transport/tcp/control.ipp>
#include <gradwire/transport/tcp/failure.ipp>
#include <gradwire/transport/tcp/join.ipp>
#include <gradwire/transport/tcp/receive.ipp>
#include <gradwire/transport/tcp/rejoin.ipp>
#include <gradwire/transport/tcp/send.ipp>
#include <gradwire/transport/tcp/wait.ipp>
#include <gradwire/transport/tcp/watch.ipp>

#include <gradwire/instances/asio_tcp.hpp>

namespace gradwire {
GRADWIRE_COLLECTIVE_INSTANCES(template, transport::asio_tcp)
}  // namespace gradwire
