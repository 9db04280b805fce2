// Test helper: a linear least-squares model y ~ W x + b with hand-computed gradients (in double).
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace gradwire::testing {

// One batch of samples: x is batch x inputs, y is batch x outputs, row-major, in double.
struct batch_data {
  std::vector<double> x, y;
};

struct least_squares {
  std::size_t inputs, outputs, batch;

  // Fresh normal samples from `gen`.
  template <class Generator>
  batch_data random_batch(Generator& gen) const {
    std::normal_distribution<double> dist;
    batch_data d{std::vector<double>(batch * inputs), std::vector<double>(batch * outputs)};
    for (auto& v : d.x) v = dist(gen);
    for (auto& v : d.y) v = dist(gen);
    return d;
  }

  // Replaces d.y with targets a linear model can fit: y = a x + c + noise * N(0, 1), with
  // a (outputs x inputs) and c (outputs), so converged training has a near-zero loss.
  template <class Generator>
  void fit_targets(batch_data& d, const std::vector<double>& a, const std::vector<double>& c, double noise,
                   Generator& gen) const {
    std::normal_distribution<double> dist;
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < outputs; ++o) {
        double y = c[o] + noise * dist(gen);
        for (std::size_t i = 0; i < inputs; ++i) y += a[o * inputs + i] * d.x[n * inputs + i];
        d.y[n * outputs + o] = y;
      }
  }

  // Gradients {dW, db} of 0.5 * mean over the batch of |W x + b - y|^2 at (w, b),
  // accumulated in double and rounded to T once.
  template <class T>
  std::vector<std::vector<T>> gradients(const T* w, const T* b, const batch_data& d) const {
    std::vector<double> gw(outputs * inputs, 0.0), gb(outputs, 0.0);
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < outputs; ++o) {
        double r = double(b[o]) - d.y[n * outputs + o];
        for (std::size_t i = 0; i < inputs; ++i) r += double(w[o * inputs + i]) * d.x[n * inputs + i];
        r /= double(batch);
        gb[o] += r;
        for (std::size_t i = 0; i < inputs; ++i) gw[o * inputs + i] += r * d.x[n * inputs + i];
      }
    return {std::vector<T>(gw.begin(), gw.end()), std::vector<T>(gb.begin(), gb.end())};
  }
};

}  // namespace gradwire::testing
