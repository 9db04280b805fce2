// Joins the job a cluster_spec describes over per_peer<ucx, asio_tcp>: UCX shared memory inside a host, TCP between hosts.
#pragma once

#include <string>
#include <utility>

#include "../transport/per_peer.hpp"
#include "spec.hpp"
#include "tcp.hpp"
#include "topology.hpp"
#include "ucx.hpp"

namespace gradwire::cluster {

// Joins the job that the environment describes: asio_tcp among all ranks (rank 0 serves
// the store, as for join_tcp; the join tells which ranks share a host: GRADWIRE_HOST_ID,
// else host name, boot and network namespace), then UCX among each host's ranks through
// the same store, under keys of their own. UCX reads UCX_TLS as usual: leave it
// unset or give `sm` (shared memory; what the host's ranks should use).
inline transport::per_peer<transport::ucx, transport::asio_tcp> join_per_peer(const overrides& given = {},
                                                                               const env_lookup& env = process_env) {
  const cluster_spec spec = detect(given, env);
  transport::asio_tcp inter(tcp_options(spec, env));
  static_assert(concepts::topology_aware_transport<transport::asio_tcp>);
  topology hosts = inter.topology();
  transport::ucx_options o = ucx_options(spec, env);
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
