// A collective as the cost models see it: the call check's frames, then rounds of messages, priced along each rank's dependencies.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "../collective/communicator.hpp"
#include "../collective/verify.hpp"
#include "cluster_model.hpp"
#include "link_cost.hpp"
#include "straggler_statistics.hpp"

namespace gradwire::plan {

// What the cost models assume about the job beyond the cluster.
struct cost_options {
  // The collectives' thresholds (which algorithm auto_ takes, reduce's tree or ring) and
  // verify (the call check's frames beside every collective's first data): the
  // communicator's defaults unless the job changes them.
  collective::communicator_options collective{};
  // Bytes per element: chunks are cut in elements, as the collectives cut them.
  std::size_t element_bytes = sizeof(float);
  // Monte Carlo steps per order statistic (straggler_statistics.hpp).
  int trials = default_monte_carlo_trials;
};

// `repeat` rounds alike (a ring's steps): listed once, run `repeat` times.
struct round_run {
  std::vector<message> messages;
  long long repeat = 1;
};

// A collective: every rank posts its call check's frames first (none without verify),
// then takes part in the rounds that have messages from or to it, in order.
struct schedule {
  std::vector<message> check;
  std::vector<round_run> runs;
};

// Its data rounds (the frames' round when there is no data).
inline long long rounds_of(const schedule& s) noexcept {
  long long n = 0;
  for (const auto& r : s.runs) n += r.repeat;
  return n == 0 && !s.check.empty() ? 1 : n;
}

// The schedule's time, each rank along its own dependencies: a rank posts a round's sends
// when it finished its previous round (or, in its first, once its frames are posted), and
// finishes the round when its sends have left and its receives arrived (each then takes
// `overhead`); the frames must have arrived before it finishes its first round, as
// call_check is settled beside the first data. Messages share the links as round_times
// queues them, from each sender's own start, behind what earlier rounds left on them
// (rounds are queued in their order, which is nearly always the order in time). A rank
// that waits for nobody runs ahead: the fold of halving-doubling delays only the ranks
// that fold, a tree's leaves send at once. Rounds in lockstep (every rank waiting for the
// slowest message) would charge every round its slowest link.
inline double schedule_seconds(const cluster_model& c, const schedule& s) {
  int ranks = 0;
  for (const auto& m : s.check) ranks = std::max({ranks, m.from + 1, m.to + 1});
  for (const auto& r : s.runs)
    for (const auto& m : r.messages) ranks = std::max({ranks, m.from + 1, m.to + 1});
  if (ranks == 0) return 0;
  const double o = seconds_of(c.overhead);
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<double> ready(n, 0), frames_in(n, 0), next(n);
  std::vector<char> started(n, 0);
  link_busy busy;
  const auto frame_times = round_times(c, s.check, {}, &busy);
  for (std::size_t i = 0; i < s.check.size(); ++i) {
    const auto from = static_cast<std::size_t>(s.check[i].from), to = static_cast<std::size_t>(s.check[i].to);
    ready[from] += o;  // its frames are posted one after another
    frames_in[to] = std::max(frames_in[to], frame_times[i].arrived + o);
  }
  double end = 0;
  for (double f : frames_in) end = std::max(end, f);
  for (const auto& run : s.runs) {
    for (long long k = 0; k < run.repeat; ++k) {
      const auto times = round_times(c, run.messages, ready, &busy);
      next = ready;
      for (std::size_t i = 0; i < run.messages.size(); ++i) {
        const auto from = static_cast<std::size_t>(run.messages[i].from), to = static_cast<std::size_t>(run.messages[i].to);
        next[from] = std::max(next[from], times[i].sent);
        next[to] = std::max(next[to], std::max(times[i].arrived, ready[to]) + o);
      }
      for (const auto& m : run.messages)
        for (const auto r : {static_cast<std::size_t>(m.from), static_cast<std::size_t>(m.to)})
          if (!started[r]) started[r] = 1, next[r] = std::max(next[r], frames_in[r]);
      ready.swap(next);
    }
  }
  for (double r : ready) end = std::max(end, r);
  return end;
}

// Ceil(elements / parts) elements in bytes: the longest of the chunks the collectives cut
// (detail::chunking gives the first elements % parts chunks one more). A round waits for
// its longest message, so every rank is priced with it.
inline double longest_chunk_bytes(std::size_t elements, std::size_t parts, std::size_t element_bytes) noexcept {
  return double((elements + parts - 1) / parts) * double(element_bytes);
}

// The call check's frames (collective/verify.hpp) of a collective over ranks 0..n-1, when
// the options verify: each rank sends a check_frame to each ring neighbour (one only for
// n = 2) and a call_descriptor to each far peer, far(r) listing the ranks it exchanges
// data with (neighbours, itself and repeats are skipped, as call_check skips them).
template <class Far>
std::vector<message> call_check_frames(int n, const cost_options& o, Far&& far) {
  std::vector<message> frames;
  if (n < 2 || !o.collective.verify) return frames;
  constexpr double frame = sizeof(collective::check_frame), descriptor = sizeof(collective::call_descriptor);
  std::vector<int> seen;
  for (int r = 0; r < n; ++r) {
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    frames.push_back({r, right, frame});
    if (left != right) frames.push_back({r, left, frame});
    seen.clear();
    for (int p : far(r)) {
      if (p == r || p == left || p == right || std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
      seen.push_back(p);
      frames.push_back({r, p, descriptor});
    }
  }
  return frames;
}

// No far peers: the ring's neighbours are all a rank talks to.
inline std::vector<int> no_far_peers(int) { return {}; }

}  // namespace gradwire::plan
