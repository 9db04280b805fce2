// Predicted time of an all-reduce on a cluster_model's ranks, per algorithm, counting the messages collective/ sends.
//
// Each algorithm is written as its schedule (schedule.hpp): the call check's frames, then
// the rounds of messages the library's code posts, with the bytes it cuts (chunking,
// segments, the fold for N not a power of two). Ranks are placed host-major (rank r on
// host r / ranks_per_host), as cluster_model places them. How the rounds are priced
// follows what each rank waits for: halving-doubling and one-shot along each rank's own
// dependencies (schedule_seconds), the ring as a recursion over its neighbours
// (ring_steps_seconds), hierarchical's rings across hosts as independent flows sharing a
// link (hierarchical_seconds). The simulated transport declares no ring_segment_bytes, so
// the flat ring runs step by step (one message per step, no pipeline). docs/planning.md
// has the closed forms; tests/plan/test_cost_model.cpp checks them by hand.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/choice.hpp"
#include "../error.hpp"
#include "cluster_model.hpp"
#include "schedule.hpp"

namespace gradwire::plan {

// The library's algorithms (collective/all_reduce.hpp), one_shot included (auto_ takes it
// for small buffers; it is not a tag of its own).
enum class all_reduce_algorithm : std::uint8_t { ring, halving_doubling, hierarchical, one_shot, auto_ };
inline constexpr all_reduce_algorithm every_all_reduce_algorithm[] = {
    all_reduce_algorithm::ring, all_reduce_algorithm::halving_doubling, all_reduce_algorithm::hierarchical,
    all_reduce_algorithm::one_shot, all_reduce_algorithm::auto_};

inline const char* name_of(all_reduce_algorithm a) noexcept {
  switch (a) {
    case all_reduce_algorithm::ring: return "ring";
    case all_reduce_algorithm::halving_doubling: return "halving_doubling";
    case all_reduce_algorithm::hierarchical: return "hierarchical";
    case all_reduce_algorithm::one_shot: return "one_shot";
    case all_reduce_algorithm::auto_: return "auto_";
  }
  return "?";
}

// Whether hierarchical_all_reduce has a hierarchy here (collective::has_hierarchy): two or
// more hosts with two or more ranks each; else it runs the flat ring.
inline bool has_hierarchy(const cluster_model& c) noexcept {
  return cluster::topology::spans_hosts_with_shared_host(c.hosts, c.ranks_per_host);
}

// Ring (ring_all_reduce.hpp, detail/ring.hpp): 2(N-1) steps, in each of which rank r sends
// one ring part (elements / N, rounded up) to rank r + 1 and receives one from r - 1, the
// first step beside the call check's frames. Host-major placement puts one network hop
// per host boundary, so no link carries two messages of a step. The schedule lists the
// steps; ring_steps_seconds prices them.
inline schedule ring_schedule(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const int n = c.size();
  schedule s;
  if (n < 2) return s;
  s.check = call_check_frames(n, o, no_far_peers);
  if (elements > 0) {
    round_run step;
    const double part = longest_chunk_bytes(elements, static_cast<std::size_t>(n), o.element_bytes);
    for (int r = 0; r < n; ++r) step.messages.push_back({r, (r + 1) % n, part});
    step.repeat = 2LL * (n - 1);
    s.runs.push_back(std::move(step));
  }
  return s;
}

// The flat ring's `steps` steps of `part` bytes, priced along their dependencies: rank r
// finishes step s once the part from r - 1 (sent when r - 1 finished step s - 1) has
// arrived and its own send has left,
//   T(r, s) = max(T(r-1, s-1) + 2 overhead + latency + part / bandwidth   (the hop into r),
//                 T(r, s-1)   +   overhead           + part / bandwidth)  (r's own send)
// (step 0 from the frames and data posted at time 0). One kind of hop (one host, or one
// rank per host): steps * (2 overhead + latency + part / bandwidth). Hosts of R ranks:
// the slow network hop is one in R, and a path through the steps crosses it about once
// per R steps, so the ring is far faster than steps x the network hop, down to the
// network link's serialisation, steps x part / bandwidth, for large parts. Every host is
// alike, so the recursion runs over the R positions of one host.
inline double ring_steps_seconds(const cluster_model& c, int steps, double part, const cost_options& o = {}) {
  const int n = c.size(), per_host = c.ranks_per_host;
  if (n < 2) return 0;
  const double ov = seconds_of(c.overhead);
  const bool spans = c.hosts > 1;
  auto link_in = [&](int p) -> const link_model& { return spans && p == 0 ? c.network : c.local; };
  auto link_out = [&](int p) -> const link_model& { return spans && p == per_host - 1 ? c.network : c.local; };
  auto left = [per_host](int p) { return (p + per_host - 1) % per_host; };
  auto lat = [](const link_model& l) { return seconds_of(l.latency); };
  // Step 0: call_check posts a frame to the right (at 1 overhead) and, for N > 2, one to
  // the left (at 2), then the data goes (at frames + 1), behind the frames on its link.
  const bool verify = o.collective.verify;
  const double frame = sizeof(collective::check_frame);
  const int frames = verify ? (n > 2 ? 2 : 1) : 0;
  std::vector<double> t(static_cast<std::size_t>(per_host)), next(t.size());
  for (int p = 0; p < per_host; ++p) {
    const link_model &in = link_in(p), &out = link_out(p);
    double done = 0;
    if (verify) {
      done = std::max(done, ov + lat(in) + frame / in.bandwidth + ov);  // the left neighbour's first send
      if (n > 2) done = std::max(done, 2 * ov + lat(out) + frame / out.bandwidth + ov);  // the right one's second
    }
    if (steps > 0) {
      // The left neighbour's frames on the link its data takes (both of them where its two
      // neighbours are reached by the same kind of link: one local port, or one host link).
      const int q = left(p);
      const bool same = n > 2 && (&link_in(q) == &link_out(q));
      const double ahead = verify ? (same ? 2 : 1) * frame / in.bandwidth : 0;
      const double start = std::max((frames + 1) * ov, verify ? ov + ahead : 0.0);
      done = std::max(done, start + lat(in) + part / in.bandwidth + ov);
      done = std::max(done, (frames + 1) * ov + part / out.bandwidth);
    }
    t[static_cast<std::size_t>(p)] = done;
  }
  for (int step = 1; step < steps; ++step) {
    for (int p = 0; p < per_host; ++p) {
      const link_model &in = link_in(p), &out = link_out(p);
      next[static_cast<std::size_t>(p)] =
          std::max(t[static_cast<std::size_t>(left(p))] + 2 * ov + lat(in) + part / in.bandwidth,
                   t[static_cast<std::size_t>(p)] + ov + part / out.bandwidth);
    }
    std::swap(t, next);
  }
  return *std::max_element(t.begin(), t.end());
}

// The ring all-reduce's time: 2(N-1) steps of one part (the call check's frames alone
// when there is nothing to reduce).
inline double ring_seconds(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const int n = c.size();
  if (n < 2) return 0;
  const double part = longest_chunk_bytes(elements, static_cast<std::size_t>(n), o.element_bytes);
  return ring_steps_seconds(c, elements > 0 ? 2 * (n - 1) : 0, part, o);
}

// Halving-doubling (halving_doubling_all_reduce.hpp): with P the largest power of two <= N,
// ranks 2i fold their whole buffer into 2i + 1 (i < N - P), the P left halve (log2 P
// exchanges of half the current range with the partner whose bit differs) and double back
// (log2 P), and the odd ranks hand the result back. Partners at distance >= ranks_per_host
// sit on other hosts, all ranks_per_host of a host at once: those rounds put
// ranks_per_host messages on each host link (priced here; the ring never does that).
inline schedule halving_doubling_schedule(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const int n = c.size();
  schedule s;
  if (n < 2) return s;
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n))), extra = n - p;
  auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  auto folded = [extra](int r) { return r < 2 * extra && r % 2 == 0; };
  auto virt = [extra](int r) { return r < 2 * extra ? r / 2 : r - extra; };
  const double eb = double(o.element_bytes), whole = double(elements) * eb;
  if (elements > 0) {
    if (extra > 0) {
      round_run fold;
      for (int i = 0; i < extra; ++i) fold.messages.push_back({2 * i, 2 * i + 1, whole});
      s.runs.push_back(std::move(fold));
    }
    const collective::detail::chunking chunks{elements, static_cast<std::size_t>(p)};
    auto bytes = [&](std::size_t lo, std::size_t hi) { return double(chunks.begin(hi) - chunks.begin(lo)) * eb; };
    std::vector<std::size_t> lo(static_cast<std::size_t>(p), 0), hi(static_cast<std::size_t>(p), static_cast<std::size_t>(p));
    for (int mask = p / 2; mask >= 1; mask >>= 1) {  // halving: give away the half the partner keeps
      round_run halve;
      for (int v = 0; v < p; ++v) {
        auto& l = lo[static_cast<std::size_t>(v)];
        auto& h = hi[static_cast<std::size_t>(v)];
        const std::size_t mid = l + static_cast<std::size_t>(mask);
        const bool upper = (v & mask) != 0;
        halve.messages.push_back({real(v), real(v ^ mask), upper ? bytes(l, mid) : bytes(mid, h)});
        (upper ? l : h) = mid;
      }
      s.runs.push_back(std::move(halve));
    }
    for (int mask = 1; mask < p; mask <<= 1) {  // doubling: send the owned range
      round_run doubling;
      for (int v = 0; v < p; ++v) {
        auto& l = lo[static_cast<std::size_t>(v)];
        auto& h = hi[static_cast<std::size_t>(v)];
        doubling.messages.push_back({real(v), real(v ^ mask), bytes(l, h)});
        const std::size_t theirs = l ^ static_cast<std::size_t>(mask), width = h - l;
        l = std::min(l, theirs);
        h = l + 2 * width;
      }
      s.runs.push_back(std::move(doubling));
    }
    if (extra > 0) {
      round_run unfold;
      for (int i = 0; i < extra; ++i) unfold.messages.push_back({2 * i + 1, 2 * i, whole});
      s.runs.push_back(std::move(unfold));
    }
  }
  s.check = call_check_frames(n, o, [&](int r) {
    std::vector<int> partners;
    if (!folded(r))
      for (int mask = p / 2; mask >= 1; mask >>= 1) partners.push_back(real(virt(r) ^ mask));
    return partners;
  });
  return s;
}

// The segments hierarchical_all_reduce cuts a buffer of `elements` into (its
// hierarchical_segments); throws errc::invalid_argument where the hosts x ranks need more
// message steps than an operation's tag space holds (the library throws the same).
inline int hierarchical_segment_count(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const std::uint32_t steps = collective::detail::hierarchical_steps(c.ranks_per_host, c.hosts);
  return collective::detail::hierarchical_segments(elements * o.element_bytes, steps);
}

namespace detail {

// The hierarchical all-reduce's shape on even hosts: K segments, each R - 1 rounds inside
// the host, 2(H - 1) across, R - 1 inside again; segment k's round i is round k + i.
struct hierarchical_shape {
  int hosts = 1, per_host = 1, segments = 1;
  double column = 0, across = 0;  // bytes of a host-ring message and of a cross-host one

  int local_steps() const noexcept { return per_host - 1; }
  int network_steps() const noexcept { return 2 * (hosts - 1); }
  int rounds() const noexcept { return segments - 1 + 2 * local_steps() + network_steps(); }
  // Round t's exchanges per rank: {inside the host, across hosts}.
  std::pair<int, int> exchanges(int t) const noexcept {
    int local = 0, network = 0;
    for (int k = 0; k < segments; ++k) {
      const int step = t - k;
      if (step < 0 || step >= 2 * local_steps() + network_steps()) continue;
      ++(step < local_steps() || step >= local_steps() + network_steps() ? local : network);
    }
    return {local, network};
  }
};

inline hierarchical_shape hierarchical_shape_of(const cluster_model& c, std::size_t elements, const cost_options& o) {
  hierarchical_shape h{c.hosts, c.ranks_per_host, hierarchical_segment_count(c, elements, o), 0, 0};
  const auto k = static_cast<std::size_t>(h.segments), r = static_cast<std::size_t>(h.per_host);
  const std::size_t segment = (elements + k - 1) / k;
  h.column = longest_chunk_bytes(segment, r, o.element_bytes);
  h.across = longest_chunk_bytes((segment + r - 1) / r, static_cast<std::size_t>(h.hosts), o.element_bytes);
  return h;
}

// A round in which each rank has `local` host-ring exchanges and `network` cross-host ones
// in flight (of different segments): to its host-ring right and to the same local rank of
// the next host.
inline std::vector<message> hierarchical_round(const hierarchical_shape& h, int local, int network) {
  std::vector<message> m;
  for (int rank = 0; rank < h.hosts * h.per_host; ++rank) {
    const int host = rank / h.per_host, l = rank % h.per_host;
    for (int k = 0; k < local; ++k) m.push_back({rank, host * h.per_host + (l + 1) % h.per_host, h.column});
    for (int k = 0; k < network; ++k) m.push_back({rank, ((host + 1) % h.hosts) * h.per_host + l, h.across});
  }
  return m;
}

}  // namespace detail

// Hierarchical (hierarchical_all_reduce.hpp), on H hosts of R ranks: in K segments (K > 1
// from 4 MiB on), each a ring reduce-scatter inside the host (R - 1 rounds of one column,
// a 1/R of the segment, on the local ports), 2(H - 1) rounds of an inter-host ring per
// local rank over a 1/H of its column (the R rings of a host share its network link: R
// messages per round), and a ring all-gather inside the host (R - 1 rounds); segment k
// runs its rounds k rounds after segment 0, so one segment's network rounds overlap
// another's local ones. Without a hierarchy (or data), the flat ring
// (collective::hierarchical_runs_flat_ring).
inline schedule hierarchical_schedule(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  if (collective::hierarchical_runs_flat_ring(has_hierarchy(c), elements)) return ring_schedule(c, elements, o);
  const detail::hierarchical_shape h = detail::hierarchical_shape_of(c, elements, o);
  const int n = c.size(), per_host = h.per_host, hosts = h.hosts;
  schedule s;
  s.check = call_check_frames(n, o, [&](int rank) {  // the host ring's and the cross-host ring's peers
    const int host = rank / per_host, l = rank % per_host;
    return std::vector<int>{host * per_host + (l + 1) % per_host, host * per_host + (l + per_host - 1) % per_host,
                            ((host + 1) % hosts) * per_host + l, ((host + hosts - 1) % hosts) * per_host + l};
  });
  for (int t = 0; t < h.rounds(); ++t) {
    const auto [local, network] = h.exchanges(t);
    if (t > 0 && h.exchanges(t - 1) == std::pair{local, network})
      ++s.runs.back().repeat;
    else
      s.runs.push_back({detail::hierarchical_round(h, local, network), 1});
  }
  return s;
}

// The hierarchical all-reduce's time. Rounds with exchanges inside the host are priced in
// lockstep (the host ring ties its ranks together), but rounds with only cross-host
// exchanges (all of them with one segment) are not: the R rings across hosts share each
// host link but do not wait for each other, so the link stays busy while each ring's
// latency passes. A run of k such rounds, b messages of m bytes per rank each, takes
//   max(k (b overhead + latency + b m / bandwidth + overhead),   (one ring's chain)
//       b overhead + latency + k R b m / bandwidth + overhead)    (the shared link's bytes)
inline double hierarchical_seconds(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  if (collective::hierarchical_runs_flat_ring(has_hierarchy(c), elements)) return ring_seconds(c, elements, o);
  const detail::hierarchical_shape h = detail::hierarchical_shape_of(c, elements, o);
  const double ov = seconds_of(c.overhead), lat = seconds_of(c.network.latency), bw = c.network.bandwidth;
  const schedule s = hierarchical_schedule(c, elements, o);
  std::vector<message> first = s.check;  // round 0, beside the call check
  first.insert(first.end(), s.runs.front().messages.begin(), s.runs.front().messages.end());
  double total = round_seconds(c, first);
  std::map<std::pair<int, int>, double> lockstep;     // a mixed round's time by its exchanges
  int run = 0, per_rank = 0;                          // network-only rounds pending, messages per rank in each
  auto close_run = [&] {
    if (run == 0) return;
    const double chain = run * (per_rank * ov + lat + per_rank * h.across / bw + ov);
    const double link = per_rank * ov + lat + double(run) * h.per_host * per_rank * h.across / bw + ov;
    total += std::max(chain, link);
    run = 0;
  };
  for (int t = 1; t < h.rounds(); ++t) {
    const auto [local, network] = h.exchanges(t);
    if (local == 0) {
      if (run > 0 && network != per_rank) close_run();
      ++run;
      per_rank = network;
      continue;
    }
    close_run();
    const auto [at, fresh] = lockstep.try_emplace({local, network}, 0.0);
    if (fresh) at->second = round_seconds(c, detail::hierarchical_round(h, local, network));
    total += at->second;
  }
  close_run();
  return total;
}

// One-shot (one_shot_all_reduce.hpp), at most one_shot_max_ranks ranks: one round in which
// every rank sends its whole buffer to every other (N - 1 messages on its links); buffers
// of at most check_inline_bytes reach the ring neighbours inside the check frames.
inline schedule one_shot_schedule(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const int n = c.size();
  if (n > collective::one_shot_max_ranks)
    throw error(errc::invalid_argument, "one_shot all-reduce: at most " + std::to_string(collective::one_shot_max_ranks) +
                                            " ranks, the cluster has " + std::to_string(n));
  schedule s;
  if (n < 2) return s;
  const double bytes = double(elements) * double(o.element_bytes);
  const bool in_frame = o.collective.verify && bytes <= double(collective::check_inline_bytes);
  round_run round;
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) {
      const bool neighbour = q == (r + 1) % n || q == (r + n - 1) % n;
      if (q != r && !(in_frame && neighbour)) round.messages.push_back({r, q, bytes});
    }
  s.check = call_check_frames(n, o, [n](int) {
    std::vector<int> everyone(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) everyone[static_cast<std::size_t>(q)] = q;
    return everyone;
  });
  s.runs.push_back(std::move(round));
  return s;
}

// What all_reduce<auto_> runs for `elements` here: collective::choose_all_reduce, the rule
// the collective itself calls, on this cluster's layout (transport::simulated, like every
// shipped transport, can run one-shot).
inline all_reduce_algorithm auto_choice(const cluster_model& c, std::size_t elements, const cost_options& o = {}) {
  const collective::algorithm_id chosen = collective::choose_all_reduce(
      {.ranks = c.size(), .hosts = c.hosts, .most_ranks_on_a_host = c.ranks_per_host, .bytes = elements * o.element_bytes},
      o.collective);
  switch (chosen) {
    case collective::algorithm_id::one_shot: return all_reduce_algorithm::one_shot;
    case collective::algorithm_id::hierarchical: return all_reduce_algorithm::hierarchical;
    case collective::algorithm_id::halving_doubling: return all_reduce_algorithm::halving_doubling;
    case collective::algorithm_id::ring:
    case collective::algorithm_id::none: break;  // (none: never chosen)
  }
  return all_reduce_algorithm::ring;
}

// One algorithm's prediction. `runs` is what actually runs: auto_'s choice, or the flat
// ring where hierarchical has no hierarchy. `available` is false where the library would
// refuse (one_shot over more than one_shot_max_ranks ranks; a hierarchy too large for the
// tag space), with the reason in `note`.
struct all_reduce_cost {
  all_reduce_algorithm algorithm = all_reduce_algorithm::auto_;
  all_reduce_algorithm runs = all_reduce_algorithm::ring;
  bool available = true;
  long long rounds = 0;
  double seconds = 0;
  std::string note;
};

// The schedule of the algorithm that runs (not auto_: ask auto_choice first).
inline schedule all_reduce_schedule(const cluster_model& c, all_reduce_algorithm a, std::size_t elements,
                                    const cost_options& o = {}) {
  switch (a) {
    case all_reduce_algorithm::ring: return ring_schedule(c, elements, o);
    case all_reduce_algorithm::halving_doubling: return halving_doubling_schedule(c, elements, o);
    case all_reduce_algorithm::hierarchical: return hierarchical_schedule(c, elements, o);
    case all_reduce_algorithm::one_shot: return one_shot_schedule(c, elements, o);
    case all_reduce_algorithm::auto_: return all_reduce_schedule(c, auto_choice(c, elements, o), elements, o);
  }
  return {};
}

// The time of the algorithm that runs (not auto_): the ring and hierarchical priced along
// their dependencies, the others round by round.
inline double all_reduce_seconds(const cluster_model& c, all_reduce_algorithm a, std::size_t elements,
                                 const cost_options& o = {}) {
  switch (a) {
    case all_reduce_algorithm::ring: return ring_seconds(c, elements, o);
    case all_reduce_algorithm::hierarchical: return hierarchical_seconds(c, elements, o);
    case all_reduce_algorithm::auto_: return all_reduce_seconds(c, auto_choice(c, elements, o), elements, o);
    default: return schedule_seconds(c, all_reduce_schedule(c, a, elements, o));
  }
}

// Predicted time of all_reduce<a> of `elements` elements over every rank of `c`.
inline all_reduce_cost predict_all_reduce(const cluster_model& c, all_reduce_algorithm a, std::size_t elements,
                                          const cost_options& o = {}) {
  all_reduce_cost cost{a, a == all_reduce_algorithm::auto_ ? auto_choice(c, elements, o) : a, true, 0, 0, {}};
  if (cost.runs == all_reduce_algorithm::hierarchical && !has_hierarchy(c)) {
    cost.runs = all_reduce_algorithm::ring;
    cost.note = "no hierarchy (one host, or one rank per host): the flat ring";
  }
  if (c.size() < 2) cost.note = "one rank: nothing to send";
  try {
    const schedule s = all_reduce_schedule(c, cost.runs, elements, o);
    cost.rounds = rounds_of(s);
    cost.seconds = all_reduce_seconds(c, cost.runs, elements, o);
    if (cost.runs == all_reduce_algorithm::hierarchical && cost.note.empty()) {
      const int k = hierarchical_segment_count(c, elements, o);
      if (k > 1) cost.note = std::to_string(k) + " segments, pipelined";
    }
  } catch (const error& e) {
    if (e.kind() != errc::invalid_argument) throw;
    cost.available = false;
    cost.note = e.details();
  }
  return cost;
}

// A bucketed all-reduce (collective/bucketing.hpp: aggregation::all_reduce, averaging):
// one all_reduce call per bucket of `buckets` (their element counts), one after another.
// Buckets of equal size are priced once.
inline all_reduce_cost predict_bucketed_all_reduce(const cluster_model& c, all_reduce_algorithm a,
                                                   std::span<const std::size_t> buckets, const cost_options& o = {}) {
  all_reduce_cost total{a, a == all_reduce_algorithm::auto_ ? auto_choice(c, 0, o) : a, true, 0, 0, {}};
  std::map<std::size_t, all_reduce_cost> priced;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    auto [at, fresh] = priced.try_emplace(buckets[i]);
    if (fresh) at->second = predict_all_reduce(c, a, buckets[i], o);
    const all_reduce_cost& one = at->second;
    if (i == 0) total.runs = one.runs, total.note = one.note;
    total.rounds += one.rounds;
    total.seconds += one.seconds;
    total.available = total.available && one.available;
    if (!one.available) total.note = one.note;
  }
  if (priced.size() > 1) {
    std::string runs;
    for (const auto& [elements, one] : priced)
      if (one.runs != total.runs) runs = std::string("; some buckets run ") + name_of(one.runs);
    total.note += (total.note.empty() ? "" : "; ") + std::to_string(buckets.size()) + " buckets" + runs;
  } else if (buckets.size() > 1) {
    total.note += (total.note.empty() ? "" : "; ") + std::to_string(buckets.size()) + " buckets";
  }
  return total;
}

}  // namespace gradwire::plan
