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
//
// Run one after another, the intra-host phases add their time to the network's. From
// 4 MiB on, the buffer is cut into 8-16 segments, each running the three phases over its
// slice with its own tag steps, staggered by one exchange (hierarchical_phases): segment
// k's inter-host exchanges travel while later segments' intra-host ones run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../support/topology.hpp"
#include "../error.hpp"
#include "choice.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/exchange.hpp"
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

// Tag steps of one inter-host run: a ring's reduce-scatter and all-gather over H hosts.
inline long long inter_host_run_steps(int hosts) noexcept { return 2LL * (hosts - 1); }

// Tag steps of one segment: the intra-host reduce-scatter from 0, run k's inter-host ring
// from inter_base + 2(H-1)k (k < C), the intra-host all-gather after all of them; returns
// that total, `segments` of which must fit below the call check's steps.
inline std::uint32_t hierarchical_steps(int columns, int hosts, int segments = 1) {
  const long long per_run = inter_host_run_steps(hosts), total = 2LL * (columns - 1) + per_run * columns;
  if (total * segments >= verify_from_left)
    throw error(errc::invalid_argument,
                "hierarchical all-reduce over " + std::to_string(hosts) + " hosts with up to " +
                    std::to_string(columns) + " ranks each needs " + std::to_string(total) +
                    " message steps, more than an operation's tag space holds: use collective::ring");
  return static_cast<std::uint32_t>(total);
}

// How many segments a buffer of `bytes` is pipelined in: one below 4 MiB, else as many of
// at least 512 KiB as fit, up to 16 (and the tag space). Measured on 2 emulated hosts at
// 1 Gbit/s, 2 and 4 ranks each, asio_tcp (issue 17): segments only pay from 4 MiB on (at
// 1 MiB four of them were slower than one with 4 ranks a host); 16 beat 8 at 64 MiB by
// 5-7%, 32 gained nothing more.
inline int hierarchical_segments(std::size_t bytes, std::uint32_t steps_per_segment) noexcept {
  if (bytes < (std::size_t{4} << 20)) return 1;
  const std::size_t wanted = std::min<std::size_t>(16, bytes / (std::size_t{512} << 10));
  const std::size_t fits = (verify_from_left - 1) / steps_per_segment;
  return static_cast<int>(std::max<std::size_t>(1, std::min(wanted, fits)));
}

// One exchange of a segment's phase program: receive part `in` from `from` (added in for a
// reduce-scatter, copied for an all-gather) while sending `out` to `to`; then, for an
// average, scale `scale` (the part this rank owns after its last inter-host reduce step).
template <class V>
struct hierarchical_step {
  std::uint32_t round;  // segment + tag step: every rank posts an exchange in the same round as its peer
  std::uint32_t tag_step;
  int segment, to, from;
  std::span<const V> out;
  std::span<V> in, scale;
  bool reduce;
};

// Appends segment `segment`'s exchanges (over `data`, its slice of the buffer) to `steps`:
// the three phases of the top of this file, in the ring's step order.
template <class V>
void hierarchical_program(const cluster::topology& topo, int me, std::span<V> data, int segment,
                          std::uint32_t steps_per_segment, std::vector<hierarchical_step<V>>& steps) {
  const int hosts = topo.host_count(), my_host = topo.host(me);
  const int columns = topo.max_local_size(), local = topo.local_rank(me);
  const std::span<const int> host_ranks = topo.ranks_on(my_host);
  const int local_size = static_cast<int>(host_ranks.size());
  const auto per_run = static_cast<std::uint32_t>(inter_host_run_steps(hosts));
  const std::uint32_t base = steps_per_segment * static_cast<std::uint32_t>(segment);
  const chunking cols{data.size(), static_cast<std::size_t>(columns)};
  auto span_of = [&](int c0, int c1) {
    return data.subspan(cols.begin(static_cast<std::size_t>(c0)),
                        cols.begin(static_cast<std::size_t>(c1)) - cols.begin(static_cast<std::size_t>(c0)));
  };
  // A ring's size-1 exchanges from tag step `step` and round `round` on: reduce-scatter or all-gather.
  auto add_ring = [&](const ring_group& g, auto&& part, std::uint32_t step, std::uint32_t round, bool reduce,
                      bool scale_last) {
    const int n = g.size;
    for (int s = 0; s < n - 1; ++s, ++step, ++round) {
      const ring_step at = reduce ? reduce_scatter_step(n, g.position, s) : all_gather_step(n, g.position, s);
      std::span<V> scale = scale_last && s == n - 2 ? part(g.position) : std::span<V>{};
      steps.push_back({static_cast<std::uint32_t>(segment) + round, base + step, segment, g.right(), g.left(),
                       std::span<const V>(part(at.send)), part(at.recv), scale, reduce});
    }
  };
  const column_owners mine{columns, local_size};
  auto host_part = [&](int l) { return span_of(mine.first(l), mine.first(l + 1)); };
  const ring_group host_ring{local_size, local, host_ranks};

  // 1. Sum the host's buffers, each rank its own columns.
  if (local_size > 1) add_ring(host_ring, host_part, 0, 0, true, false);

  // 2. Across hosts, run by run. A run ends where any host's ownership changes. Rounds
  // follow the tag steps (the same on both ends of every exchange), except on even hosts,
  // where local rank l owns exactly run l, with local rank l of every other host: there
  // all runs take the same rounds, so no rank idles through the others' runs.
  bool even = true;
  for (int h = 0; h < hosts; ++h) even = even && static_cast<int>(topo.ranks_on(h).size()) == columns;
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
      auto part = [&](int i) {
        return span.subspan(parts.begin(static_cast<std::size_t>(i)), parts.length(static_cast<std::size_t>(i)));
      };
      const ring_group across{hosts, my_host, owners};
      const std::uint32_t run_step = inter_base + per_run * static_cast<std::uint32_t>(run);
      const std::uint32_t run_round = even ? inter_base : run_step, half = static_cast<std::uint32_t>(hosts - 1);
      add_ring(across, part, run_step, run_round, true, true);
      add_ring(across, part, run_step + half, run_round + half, false, false);
    }
    c0 = c1;
  }

  // 3. Every rank of the host gets every column.
  const std::uint32_t gather_step = inter_base + per_run * static_cast<std::uint32_t>(columns);
  if (local_size > 1)
    add_ring(host_ring, host_part, gather_step, even ? inter_base + per_run : gather_step, false, false);
}

// The buffer in K segments, each running the phases above, staggered by one round: round
// t posts the exchange of every segment k whose own round (its tag step, compressed on
// even hosts) is t - k, then completes them all. Both ends of an exchange compute the same
// round, so every round's exchanges are posted on both sides once the earlier rounds are
// done everywhere: no round waits on a later one. Segment k's
// inter-host exchanges so travel while later segments' intra-host ones run. One segment:
// one exchange at a time, the plain phases.
// The call check is posted here, once the program is known (its peers beyond the ring
// neighbours get far frames), and settled beside the first round's messages.
template <class Tr, class V>
void hierarchical_phases(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, reduce_op op,
                         const call_descriptor& mine) {
  const cluster::topology& topo = comm.topology();
  const std::uint32_t per_segment = hierarchical_steps(topo.max_local_size(), topo.host_count());
  const int segments = hierarchical_segments(data.size_bytes(), per_segment);
  hierarchical_steps(topo.max_local_size(), topo.host_count(), segments);
  const chunking cut{data.size(), static_cast<std::size_t>(segments)};
  std::vector<hierarchical_step<V>> steps;
  for (int k = 0; k < segments; ++k)
    hierarchical_program(topo, comm.rank(), data.subspan(cut.begin(k), cut.length(k)), k, per_segment, steps);
  std::stable_sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.round < b.round; });
  std::optional<call_check<Tr>> check;
  {
    std::vector<int> peers;
    for (const auto& s : steps) peers.push_back(s.to), peers.push_back(s.from);
    post_call_check(check, comm, sequence, mine, peers);
  }

  // Staging for transports that cannot add on delivery: a slice per segment, since each
  // segment may have a reduce in flight in the same round.
  std::span<V> scratch;
  std::size_t slice = 0;
  if constexpr (!concepts::accumulating_transport<Tr, V>) {
    for (const auto& s : steps)
      if (s.reduce) slice = std::max(slice, s.in.size());
    scratch = comm.template scratch<V>(slice * static_cast<std::size_t>(segments));
  }
  std::vector<posted_exchange<Tr, V>> posted;
  posted.reserve(static_cast<std::size_t>(segments));
  const V inverse = V(1) / V(comm.size());
  for (std::size_t i = 0; i < steps.size();) {
    std::size_t end = i;
    for (; end < steps.size() && steps[end].round == steps[i].round; ++end) {
      const auto& s = steps[end];
      const std::span<V> staging =
          scratch.empty() ? scratch : scratch.subspan(slice * static_cast<std::size_t>(s.segment), slice);
      posted.push_back(
          post_exchange(comm, make_tag(sequence, s.tag_step), s.to, s.out, s.from, s.in, s.reduce, staging));
    }
    settle_call_check(check);  // the first round's messages are posted
    const deadline until = comm.step_deadline();
    for (std::size_t j = i; j < end; ++j) {
      complete_exchange(comm, posted[j - i], until);
      if (op == reduce_op::average && !steps[j].scale.empty())
        kernels::scale(steps[j].scale.data(), inverse, steps[j].scale.size());
    }
    posted.clear();
    i = end;
  }
  settle_call_check(check);  // settled in the first round already; no path returns with it posted
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
  require_known(op, "hierarchical_all_reduce");
  const std::uint64_t sequence = comm.begin_operation();
  const call_descriptor mine{operation::all_reduce, static_cast<std::uint32_t>(op), data.size(), dtype_of_v<V>,
                             algorithm_id::hierarchical};
  if (comm.size() == 1) return;
  if (hierarchical_runs_flat_ring(has_hierarchy(comm), data.size()))
    return detail::checked_ring_all_reduce(comm, sequence, data, op, mine);
  detail::hierarchical_phases(comm, sequence, data, op, mine);
}

}  // namespace gradwire::collective
