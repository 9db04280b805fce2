// Joining over TCP from the environment: definitions of tcp.hpp. Compiled once in src/asio.cpp, or
// included by tcp.hpp in header-only mode (config.hpp).
#pragma once

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include "tcp.hpp"

namespace gradwire::cluster {

GRADWIRE_DECL std::optional<std::chrono::milliseconds> seconds_from(const env_lookup& env, const char* name) {
  const auto text = env(name);
  if (!text || text->empty()) return std::nullopt;
  return parse_seconds(name, *text);
}

GRADWIRE_DECL long long integer_from(const env_lookup& env, const char* name, long long fallback, long long max) {
  const auto text = env(name);
  if (!text || text->empty()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || v < 0 || v > max)
    throw error(errc::config, std::string(name) + "='" + *text + "' is not an integer from 0 to " + std::to_string(max));
  return v;
}

GRADWIRE_DECL transport::asio_tcp_options tcp_options(const cluster_spec& spec, const env_lookup& env) {
  transport::asio_tcp_options o;
  o.rank = spec.rank;
  o.size = spec.world_size;
  o.job_token = spec.job_token;
  o.store_host = spec.master_addr;
  o.store_port = static_cast<std::uint16_t>(spec.master_port);
  const bool local = spec.master_addr == "127.0.0.1" || spec.master_addr == "localhost" || spec.master_addr == "::1";
  o.listen_host = env("GRADWIRE_LISTEN_HOST").value_or(local ? "127.0.0.1" : "");
  if (auto t = seconds_from(env, "GRADWIRE_TIMEOUT")) o.connect_timeout = *t;
  o.checksum_payload = integer_from(env, "GRADWIRE_WIRE_CHECKSUM", 0, 1) == 1;  // "yes" is refused, not read as 0
  o.host_id = env("GRADWIRE_HOST_ID").value_or("");  // empty: detected (rendezvous/host_identity.hpp)
  o.local_size = spec.local_world_size;
  o.socket_buffer_bytes = static_cast<int>(integer_from(env, "GRADWIRE_SOCKET_BUFFER", 0, 1 << 30));
  o.poll_before_sleep = std::chrono::microseconds(
      integer_from(env, "GRADWIRE_POLL_US", o.poll_before_sleep.count(), 1000000));
  o.heartbeat_interval = std::chrono::seconds(integer_from(env, "GRADWIRE_HEARTBEAT", o.heartbeat_interval.count(), 3600));
  if (auto t = seconds_from(env, "GRADWIRE_STALL_WARN")) o.stall_warn = *t;
  if (auto t = seconds_from(env, "GRADWIRE_STALL_TIMEOUT")) o.stall_timeout = *t;
  o.rejoin = integer_from(env, "GRADWIRE_REJOIN", 0, 1) == 1;
  return o;
}

GRADWIRE_DECL transport::asio_tcp join_tcp(const overrides& given, const env_lookup& env) {
  return transport::asio_tcp(tcp_options(detect(given, env), env));
}

}  // namespace gradwire::cluster
