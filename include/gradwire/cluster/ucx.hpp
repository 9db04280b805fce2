// Joins the job a cluster_spec describes over UCX: cluster detection meets transport::ucx.
#pragma once

#include "../config.hpp"
#include "../transport/ucx.hpp"
#include "spec.hpp"
#include "tcp.hpp"  // seconds_from, integer_from

namespace gradwire::cluster {

// The UCX transport's settings for `spec`. gradwire reads GRADWIRE_TIMEOUT (seconds to
// join), GRADWIRE_POLL_US, GRADWIRE_HEARTBEAT and GRADWIRE_STALL_WARN as for TCP, GRADWIRE_UCX_PEER_ERRORS=0 and
// GRADWIRE_UCX_BULK_BYTES, GRADWIRE_UCX_ONE_SIDED=auto|on|off (see ucx_options); UCX reads its own environment (UCX_TLS,
// UCX_NET_DEVICES, ...; see docs/transports.md).
GRADWIRE_DECL transport::ucx_options ucx_options(const cluster_spec& spec, const env_lookup& env = process_env);

// Joins the job that the environment (torchrun, mpirun, Slurm, TF_CONFIG) describes.
GRADWIRE_DECL transport::ucx join_ucx(const overrides& given = {}, const env_lookup& env = process_env);

}  // namespace gradwire::cluster

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/ucx.cpp (config.hpp)
#include "ucx.ipp"
#endif
