// Expected order statistics of the workers' per-step compute times under a straggler_model (Monte Carlo).
//
// Synchronous training waits for the slowest of W workers every step, so what matters is
// E[max], not the mean; backup workers close a step at the (W-b)-th arrival; bounded
// staleness and local SGD let a worker's slow steps average out over a window before it
// waits. None of these has a closed form for a log-normal body with a capped Pareto tail,
// so they are estimated by drawing steps with straggler_model::draw, the simulator's own
// draw, from the cluster's seed: the same model gives the same numbers on every platform
// and every run (std::mt19937_64 is specified exactly; draw uses no std:: distribution).
// Every estimate draws the same sequence (trial after trial, worker after worker within
// one), so trial by trial the max is >= the (W-b)-th, and so are their averages.
// With no random part (no jitter, no tail) the factors are fixed and the results exact.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "cluster_model.hpp"

namespace gradwire::plan {

// 2000 steps: the estimate of E[max of 100] for jitter 0.1 with a 2% Pareto tail moves
// by about 1% between seeds, well inside what the cost model itself can claim.
inline constexpr int default_monte_carlo_trials = 2000;

// Worker w of `workers` (ranks 0..W-1 of cluster `c`) computes for
// step_seconds * c.speed * c.stragglers.fixed_factor(w) * c.stragglers.draw(rng) per step.
class compute_statistics {
 public:
  compute_statistics(const cluster_model& c, int workers, double step_seconds,
                     int trials = default_monte_carlo_trials)
      : c_(c), workers_(workers), step_(step_seconds), trials_(trials) {
    if (workers < 1) throw error(errc::invalid_argument, "compute_statistics: workers must be >= 1");
    if (!(step_seconds >= 0)) throw error(errc::invalid_argument, "compute_statistics: the step time must be >= 0");
    if (trials < 1) throw error(errc::invalid_argument, "compute_statistics: trials must be >= 1");
  }

  int workers() const noexcept { return workers_; }
  // The steps drawn for an estimate over windows of `window` steps: `trials`, fewer where
  // W * window * trials would pass 2e7 draws (never fewer than 100).
  int trials(int window = 1) const noexcept {
    const double budget = 2e7 / (double(workers_) * double(window));
    return static_cast<int>(std::clamp<double>(budget, std::min(100, trials_), trials_));
  }

  // E[the k-th shortest of one step's W compute times], k in 1..W (k = W: the slowest).
  // With `offsets` (one per worker): of offsets[w] + worker w's compute time, for workers
  // that start (or whose results land) at different times.
  double expected_order_statistic(int k, std::span<const double> offsets = {}) const {
    if (k < 1 || k > workers_)
      throw error(errc::invalid_argument, "compute_statistics: order statistic " + std::to_string(k) + " of " +
                                              std::to_string(workers_) + " workers (expected 1.." +
                                              std::to_string(workers_) + ")");
    if (!offsets.empty() && offsets.size() != static_cast<std::size_t>(workers_))
      throw error(errc::invalid_argument, "compute_statistics: " + std::to_string(offsets.size()) + " offsets for " +
                                              std::to_string(workers_) + " workers");
    auto offset = [&](int w) { return offsets.empty() ? 0.0 : offsets[static_cast<std::size_t>(w)]; };
    const auto at = static_cast<std::size_t>(k - 1);
    std::vector<double> f(static_cast<std::size_t>(workers_));
    if (!c_.stragglers.random()) {
      for (int w = 0; w < workers_; ++w) f[static_cast<std::size_t>(w)] = offset(w) + step_ * fixed(w);
      std::nth_element(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(at), f.end());
      return f[at];
    }
    std::mt19937_64 rng(c_.seed);
    const int n = trials();
    double sum = 0;
    for (int t = 0; t < n; ++t) {
      for (int w = 0; w < workers_; ++w)
        f[static_cast<std::size_t>(w)] = offset(w) + step_ * fixed(w) * c_.stragglers.draw(rng);
      std::nth_element(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(at), f.end());
      sum += f[at];
    }
    return sum / n;
  }

  // E[the slowest worker's compute time]: a synchronous step's compute.
  double expected_max() const { return expected_order_statistic(workers_); }

  // E[max over workers of each worker's mean compute time over `window` consecutive
  // steps]: window 1 is expected_max(); as the window grows it tends to the slowest
  // worker's mean. Local SGD with period H waits once per H steps (window H); bounded
  // staleness s is priced with window s + 1 (see strategy_cost.hpp).
  double expected_max_mean(int window) const {
    if (window < 1) throw error(errc::invalid_argument, "compute_statistics: the window must be >= 1 step");
    if (!c_.stragglers.random()) return expected_max();
    std::mt19937_64 rng(c_.seed);
    const int n = trials(window);
    double sum = 0;
    for (int t = 0; t < n; ++t) {
      double most = 0;
      for (int w = 0; w < workers_; ++w) {
        double total = 0;
        for (int s = 0; s < window; ++s) total += c_.stragglers.draw(rng);
        most = std::max(most, step_ * fixed(w) * (total / window));  // window 1: the order statistic's very numbers
      }
      sum += most;
    }
    return sum / n;
  }

  // E[straggler_model::draw]: the random factor's mean (1 without jitter or tail).
  double mean_draw() const {
    if (!c_.stragglers.random()) return 1;
    std::mt19937_64 rng(c_.seed);
    const int n = trials();
    double sum = 0;
    for (int t = 0; t < n; ++t)
      for (int w = 0; w < workers_; ++w) sum += c_.stragglers.draw(rng);
    return sum / (double(n) * workers_);
  }

  // E[worker w's compute time]: what it averages when nobody waits for anybody.
  double expected(int worker, double mean_draw) const { return step_ * fixed(worker) * mean_draw; }

 private:
  double fixed(int w) const noexcept { return c_.speed * c_.stragglers.fixed_factor(w); }

  cluster_model c_;  // a copy: statistics may outlive the model they were made from
  int workers_;
  double step_;
  int trials_;
};

}  // namespace gradwire::plan
