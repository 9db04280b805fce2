// Joining over UCX from the environment: definitions of ucx.hpp. Compiled once in src/ucx.cpp, or
// included by ucx.hpp in header-only mode (config.hpp).
#pragma once

#include "ucx.hpp"

namespace gradwire::cluster {

GRADWIRE_DECL transport::ucx_options ucx_options(const cluster_spec& spec, const env_lookup& env) {
  transport::ucx_options o;
  o.rejoin = integer_from(env, "GRADWIRE_REJOIN", 0, 1) == 1;
  o.rank = spec.rank;
  o.size = spec.world_size;
  o.job_token = spec.job_token;
  o.store_host = spec.master_addr;
  o.store_port = static_cast<std::uint16_t>(spec.master_port);
  if (auto t = seconds_from(env, "GRADWIRE_TIMEOUT")) o.connect_timeout = *t;
  o.local_size = spec.local_world_size;
  o.host_id = env("GRADWIRE_HOST_ID").value_or("");  // empty: detected (rendezvous/host_identity.hpp)
  o.poll_before_sleep =
      std::chrono::microseconds(integer_from(env, "GRADWIRE_POLL_US", o.poll_before_sleep.count(), 1000000));
  o.peer_error_handling = integer_from(env, "GRADWIRE_UCX_PEER_ERRORS", 1, 1) == 1;  // "off" is refused, not read as 1
  o.heartbeat_interval = std::chrono::seconds(integer_from(env, "GRADWIRE_HEARTBEAT", o.heartbeat_interval.count(), 3600));
  if (auto t = seconds_from(env, "GRADWIRE_STALL_WARN")) o.stall_warn = *t;
  if (auto t = seconds_from(env, "GRADWIRE_STALL_TIMEOUT")) o.stall_timeout = *t;
  o.bulk_bytes = static_cast<std::size_t>(integer_from(env, "GRADWIRE_UCX_BULK_BYTES", static_cast<long long>(o.bulk_bytes), 1LL << 40));
  if (const auto one_sided = env("GRADWIRE_UCX_ONE_SIDED")) {
    using use = transport::ucx_options::one_sided_use;
    if (*one_sided == "auto") o.one_sided = use::automatic;
    else if (*one_sided == "on" || *one_sided == "1") o.one_sided = use::always;
    else if (*one_sided == "off" || *one_sided == "0") o.one_sided = use::never;
    else throw error(errc::config, "GRADWIRE_UCX_ONE_SIDED=" + *one_sided + ": expected auto, on or off");
  }
  return o;
}

GRADWIRE_DECL transport::ucx join_ucx(const overrides& given, const env_lookup& env) {
  return transport::ucx(ucx_options(detect(given, env), env));
}

}  // namespace gradwire::cluster
