// Joins the job a cluster_spec describes over per_peer<ucx, asio_tcp>: UCX shared memory inside a host, TCP between hosts.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../transport/per_peer.hpp"
#include "spec.hpp"
#include "tcp.hpp"
#include "topology.hpp"
#include "ucx.hpp"

namespace gradwire::cluster {

namespace detail {

// This rank's host: GRADWIRE_HOST_ID if set, else host name, boot and network namespace
// (so each emulated host, a namespace of one machine, is a host of its own).
inline std::string per_peer_host_identity(const env_lookup& env) {
  if (auto id = env("GRADWIRE_HOST_ID")) return "id:" + *id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  const std::string netns = ::stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : "";
  return std::string(name) + "/" + boot + "/" + netns;
}

// Every rank's host identity (its FNV-1a hash), exchanged over `t`, as a topology.
template <concepts::transport T>
topology exchange_topology(T& t, const std::string& identity, deadline until) {
  constexpr std::uint64_t tag = (std::uint64_t{1} << 47) + 0x7065;  // before any collective: no clash
  const int me = t.rank(), n = t.size();
  std::vector<std::uint64_t> ids(static_cast<std::size_t>(n));
  ids[static_cast<std::size_t>(me)] = fnv1a(identity);
  std::vector<typename T::request> pending;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    pending.push_back(t.async_send(r, tag, std::as_bytes(std::span(&ids[static_cast<std::size_t>(me)], 1))));
    pending.push_back(t.async_recv(r, tag, std::as_writable_bytes(std::span(&ids[static_cast<std::size_t>(r)], 1))));
  }
  for (auto& p : pending) t.wait(p, until);
  std::vector<std::string> keys;
  for (std::uint64_t id : ids) keys.push_back(std::to_string(id));
  return topology::from_identities(keys);
}

// The hosts of `t`'s ranks: its own topology where it learnt one at join, else exchanged.
template <concepts::transport T>
topology learn_topology(T& t, const env_lookup& env, deadline until) {
  if constexpr (concepts::topology_aware_transport<T>)
    return t.topology();
  else
    return exchange_topology(t, per_peer_host_identity(env), until);
}

}  // namespace detail

// Joins the job that the environment describes: asio_tcp among all ranks (rank 0 serves
// the store, as for join_tcp), then the hosts are learnt (the network transport's
// topology, or host identities exchanged over it), then UCX among each host's ranks
// through the same store, with keys of their own. UCX reads UCX_TLS as usual: leave it
// unset or give `sm` (shared memory; what the host's ranks should use).
inline transport::per_peer<transport::ucx, transport::asio_tcp> join_per_peer(const overrides& given = {},
                                                                               const env_lookup& env = process_env) {
  const cluster_spec spec = detect(given, env);
  transport::asio_tcp inter(tcp_options(spec, env));
  const transport::ucx_options defaults = ucx_options(spec, env);
  topology hosts = detail::learn_topology(inter, env, deadline_after(defaults.connect_timeout));
  transport::ucx_options o = defaults;
  const int host = hosts.host(spec.rank);
  o.rank = hosts.local_rank(spec.rank);
  o.size = hosts.local_size(spec.rank);
  o.local_size = o.size;
  o.serve_store = false;  // inter's rank 0 serves it
  o.store_prefix = "gradwire/per_peer/host" + std::to_string(host) + "/ucx/";
  transport::ucx intra(o);
  return {std::move(intra), std::move(inter), std::move(hosts)};
}

}  // namespace gradwire::cluster
