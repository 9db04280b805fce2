// Joins the job a cluster_spec describes over per_peer<ucx, asio_tcp>: UCX shared memory inside a host, TCP between hosts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../transport/per_peer.hpp"
#include "spec.hpp"
#include "tcp.hpp"
#include "../support/topology.hpp"
#include "ucx.hpp"

namespace gradwire::cluster {

namespace detail {

// A barrier over `t` through rank 0 (the join's last step; no collective exists yet).
template <concepts::transport T>
void joined_everywhere(T& t, deadline until) {
  constexpr std::uint64_t tag = (std::uint64_t{1} << 47) + 0x7070;  // far above collective::make_tag of any real job
  std::byte token{1};
  const std::span<std::byte> in(&token, 1);
  if (t.rank() != 0) {
    auto s = t.async_send(0, tag, in);
    auto r = t.async_recv(0, tag, in);
    t.wait(s, until);
    t.wait(r, until);
    return;
  }
  std::vector<std::byte> heard(static_cast<std::size_t>(t.size()));
  std::vector<typename T::request> ops;
  for (int r = 1; r < t.size(); ++r) ops.push_back(t.async_recv(r, tag, std::span(&heard[static_cast<std::size_t>(r)], 1)));
  for (auto& op : ops) t.wait(op, until);
  ops.clear();
  for (int r = 1; r < t.size(); ++r) ops.push_back(t.async_send(r, tag, in));
  for (auto& op : ops) t.wait(op, until);
}

}  // namespace detail

// UCX's bulk threshold inside per_peer (GRADWIRE_UCX_BULK_BYTES overrides it). A
// medium message on the error-handling endpoint travels by a rendezvous of several
// round trips, and inside per_peer each may wait for the sender's turn (it may be asleep
// in TCP); the bulk endpoint's single-copy (CMA) rendezvous takes one. 2 hosts x 2
// ranks on loopback, 256 KiB ring all-reduce: 7.7 ms with UCX's 256 KiB, 1.2 ms with
// 16 KiB (4 MiB unchanged, 9 ms).
inline constexpr std::size_t per_peer_ucx_bulk_bytes = std::size_t{16} << 10;

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
  if (!env("GRADWIRE_UCX_BULK_BYTES")) o.bulk_bytes = std::min(o.bulk_bytes, per_peer_ucx_bulk_bytes);
  o.store_prefix = "gradwire/per_peer/host" + std::to_string(host) + "/ucx/";
  transport::ucx intra(o);
  // Every host's UCX join is done before any rank goes on: otherwise a host that joined
  // first may fail its first collective and take rank 0's store down while another host
  // still joins through it (that host would report a missing store, not the failure).
  detail::joined_everywhere(inter, clock::now() + o.connect_timeout);
  return {std::move(intra), std::move(inter), std::move(hosts)};
}

// What the pair offers (wait_any, fail, traffic, loss tolerance: both parts have them;
// async_recv_accumulate: UCX has none, so reductions receive and add).
static_assert(concepts::multiplexing_transport<transport::per_peer<transport::ucx, transport::asio_tcp>> &&
              concepts::failable_transport<transport::per_peer<transport::ucx, transport::asio_tcp>> &&
              concepts::metered_transport<transport::per_peer<transport::ucx, transport::asio_tcp>> &&
              concepts::loss_tolerant_transport<transport::per_peer<transport::ucx, transport::asio_tcp>> &&
              concepts::topology_aware_transport<transport::per_peer<transport::ucx, transport::asio_tcp>>);
static_assert(!concepts::accumulating_transport<transport::per_peer<transport::ucx, transport::asio_tcp>, float>);

}  // namespace gradwire::cluster
