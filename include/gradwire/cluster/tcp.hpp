// Joins the job a cluster_spec describes over TCP: cluster detection meets transport::asio_tcp.
#pragma once

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include "../config.hpp"
#include "../error.hpp"
#include "../timeouts.hpp"
#include "../transport/asio_tcp.hpp"
#include "spec.hpp"

namespace gradwire::cluster {

// Seconds from an environment variable ("30", "0.5"); nullopt if unset or empty.
GRADWIRE_DECL std::optional<std::chrono::milliseconds> seconds_from(const env_lookup& env, const char* name);

// A non-negative integer from an environment variable; `fallback` if unset or empty.
GRADWIRE_DECL long long integer_from(const env_lookup& env, const char* name, long long fallback, long long max);

// The TCP transport's settings for `spec`, with the knobs gradwire reads from the
// environment: GRADWIRE_TIMEOUT (seconds to join the job; default 5 minutes),
// GRADWIRE_LISTEN_HOST (address to accept peers on; default loopback for a job on one
// machine, else the address this rank reaches MASTER_ADDR from), GRADWIRE_WIRE_CHECKSUM=1
// (CRC-32C over payloads too), GRADWIRE_SOCKET_BUFFER (bytes), GRADWIRE_POLL_US,
// GRADWIRE_HOST_ID (which ranks share a host; see rendezvous/host_identity.hpp), and the
// failure detection's GRADWIRE_HEARTBEAT (whole seconds, 0: off), GRADWIRE_STALL_WARN and
// GRADWIRE_STALL_TIMEOUT (seconds; defaults in timeouts.hpp, all listed in docs/errors.md#timeouts),
// and GRADWIRE_REJOIN=1 (this process replaces a lost rank: asio_tcp_options::rejoin).
GRADWIRE_DECL transport::asio_tcp_options tcp_options(const cluster_spec& spec, const env_lookup& env = process_env);

// Joins the job that the environment (torchrun, mpirun, Slurm, TF_CONFIG) describes.
GRADWIRE_DECL transport::asio_tcp join_tcp(const overrides& given = {}, const env_lookup& env = process_env);

}  // namespace gradwire::cluster

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/asio.cpp (config.hpp)
#include "tcp.ipp"
#endif
