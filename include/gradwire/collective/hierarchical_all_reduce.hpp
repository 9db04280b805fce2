// Hierarchical all-reduce: reduce-scatter inside each host, all-reduce across hosts, all-gather inside each host.
//
// Links inside a host (shared memory, loopback) are far faster than the network between
// hosts. A flat ring sends 2(N-1)/N of the buffer over every link, the slowest included;
// here each rank sends only its host's share across: with P ranks on each of H hosts,
// local rank l runs one inter-host ring with local rank l of every other host over 1/P
// of the data, so the P rings share the network in parallel and each host sends
// 2(H-1)/H of the buffer across in total (not 2(N-1)/N per rank of it).
//
// Uneven hosts (3 hosts with 1, 2 and 3 ranks; ranks of a host need not be contiguous):
// the buffer is cut into C = (most ranks on any host) columns (the ring's chunking over
// C); on a host with L ranks, local rank l owns columns [floor(lC/L), floor((l+1)C/L)),
// so every rank owns at least one column and a host's ranks together own them all.
//   1. Ring reduce-scatter among the ranks of each host over that partition: each rank
//      holds its columns summed over its host.
//   2. For each maximal run of columns whose owner is the same on every host, a ring
//      all-reduce among those owners (one per host): reduce-scatter, scale by 1/N for
//      an average, all-gather. A rank walks its runs in increasing column order, the
//      same global order on every rank, so the rings cannot wait on each other in a
//      cycle; runs with disjoint owners (even hosts: one per local rank) run in parallel.
//   3. Ring all-gather among the ranks of each host over the same partition.
// Every element is reduced on exactly one rank and then only copied: bit-identical on
// every rank. One host, or one rank per host, has no hierarchy: the flat ring runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../cluster/topology.hpp"
#include "../error.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/ring.hpp"
#include "verify.hpp"

namespace gradwire::collective {

namespace detail {

// The columns of a host with `local_size` ranks that local rank l owns: [first(l), first(l+1)).
struct column_owners {
  int columns, local_size;
  int first(int l) const noexcept { return static_cast<int>(static_cast<long long>(l) * columns / local_size); }
  // The local rank that owns column c: the l with first(l) <= c < first(l + 1).
  int owner(int c) const noexcept {
    return static_cast<int>((static_cast<long long>(c + 1) * local_size - 1) / columns);
  }
};

// Tag steps: the intra-host reduce-scatter from 0, run k's inter-host ring from
// inter_base + 2(H-1)k (k < C), the intra-host all-gather after all of them.
inline std::uint32_t hierarchical_steps(int columns, int hosts) {
  const long long per_run = 2LL * (hosts - 1), total = 2LL * (columns - 1) + per_run * columns;
  if (total >= verify_from_left)
    throw error(errc::invalid_argument,
                "hierarchical all-reduce over " + std::to_string(hosts) + " hosts with up to " +
                    std::to_string(columns) + " ranks each needs " + std::to_string(total) +
                    " message steps, more than an operation's tag space holds: use collective::ring");
  return static_cast<std::uint32_t>(per_run);
}

template <class Tr, class V>
void hierarchical_phases(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op) {
  const cluster::topology& topo = comm.topology();
  const int me = comm.rank(), hosts = topo.host_count(), my_host = topo.host(me);
  const int columns = topo.max_local_size(), local = topo.local_rank(me);
  const std::span<const int> host_ranks = topo.ranks_on(my_host);
  const int local_size = static_cast<int>(host_ranks.size());
  const std::uint32_t per_run = hierarchical_steps(columns, hosts);
  const chunking cols{data.size(), static_cast<std::size_t>(columns)};
  auto span_of = [&](int c0, int c1) {
    return data.subspan(cols.begin(static_cast<std::size_t>(c0)),
                        cols.begin(static_cast<std::size_t>(c1)) - cols.begin(static_cast<std::size_t>(c0)));
  };
  const column_owners mine{columns, local_size};
  auto host_part = [&](int l) { return span_of(mine.first(l), mine.first(l + 1)); };
  const ring_group host_ring{local_size, local, host_ranks};

  // 1. Sum the host's buffers, each rank its own columns.
  std::uint32_t step = 0;
  if (local_size > 1) ring_reduce_scatter(comm, sequence, step, host_ring, host_part, reduce_op::sum, 1);

  // 2. Across hosts, run by run. A run ends where any host's ownership changes.
  const std::uint32_t inter_base = static_cast<std::uint32_t>(columns - 1);
  std::vector<int> owners(static_cast<std::size_t>(hosts));
  const int my_first = mine.first(local), my_end = mine.first(local + 1);
  int run = 0;
  for (int c0 = 0; c0 < my_end; ++run) {
    int c1 = columns;
    for (int h = 0; h < hosts; ++h) {
      const column_owners there{columns, static_cast<int>(topo.ranks_on(h).size())};
      const int l = there.owner(c0);
      owners[static_cast<std::size_t>(h)] = topo.ranks_on(h)[static_cast<std::size_t>(l)];
      c1 = std::min(c1, there.first(l + 1));
    }
    const std::span<V> span = span_of(c0, c1);
    if (c0 >= my_first && !span.empty()) {
      const chunking parts{span.size(), static_cast<std::size_t>(hosts)};
      auto part = [&](int i) { return span.subspan(parts.begin(static_cast<std::size_t>(i)), parts.length(static_cast<std::size_t>(i))); };
      const ring_group across{hosts, my_host, owners};
      std::uint32_t run_step = inter_base + per_run * static_cast<std::uint32_t>(run);
      ring_reduce_scatter(comm, sequence, run_step, across, part, op, comm.size());
      ring_all_gather(comm, sequence, run_step, across, part);
    }
    c0 = c1;
  }

  // 3. Every rank of the host gets every column.
  step = inter_base + per_run * static_cast<std::uint32_t>(columns);
  if (local_size > 1) ring_all_gather(comm, sequence, step, host_ring, host_part);
}

}  // namespace detail

// Whether hierarchical_all_reduce has a hierarchy to use (else it runs the flat ring):
// the ranks span two or more hosts and some host has two or more ranks.
template <class Tr>
bool has_hierarchy(const communicator<Tr>& comm) noexcept {
  return comm.topology().spans_hosts_with_shared_host();
}

// Reduces `data` element-wise across all ranks, in place, bit-identical on every rank,
// along the communicator's topology (see the top of this file). Every rank passes the
// same count; the call check names this algorithm, so ranks that run another one get a
// mismatch even where this one falls back to the flat ring.
template <class Tr, class V>
void hierarchical_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op = reduce_op::sum) {
  const std::uint64_t sequence = comm.begin_operation();
  verify_same_call(comm, sequence,
                   {operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>,
                    algorithm_id::hierarchical});
  if (comm.size() == 1 || data.empty()) return;
  if (!has_hierarchy(comm)) {
    std::uint32_t step = 0;
    detail::ring_reduce_scatter(comm, sequence, step, data, op);
    detail::ring_all_gather(comm, sequence, step, data);
    return;
  }
  detail::hierarchical_phases(comm, sequence, data, op);
}

}  // namespace gradwire::collective
