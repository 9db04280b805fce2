// Test helper: every "got is close to want" check the tests share, written once; each
// overload keeps the tolerance its callers had (host-only, so .cu files include it too).
#pragma once

#include <catch2/catch.hpp>

#include "helpers/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace gradwire::test {

// got[i] within allowed[i] of want[i] (absolute, per element): kernels against float64.
template <class T>
void require_close(std::span<const T> got, const std::vector<double>& want, const std::vector<double>& allowed) {
  const auto c = compare<T>(got, want, allowed);
  INFO(c);
  REQUIRE(c.ok());
}

// got[i] within 4x the bound carried by want[i] (compare's safety): optimizers against float64.
template <class T>
void require_close(std::span<const T> got, const std::vector<bounded>& want) {
  const auto c = compare<T>(got, std::span<const bounded>(want));
  INFO(c);
  REQUIRE(c.ok());
}

// Vectors (e.g. downloaded and widened from a device) as spans.
template <class T>
void require_close(const std::vector<T>& got, const std::vector<double>& want, const std::vector<double>& allowed) {
  require_close<T>(std::span<const T>(got), want, allowed);
}
template <class T>
void require_close(const std::vector<T>& got, const std::vector<bounded>& want) {
  require_close<T>(std::span<const T>(got), want);
}

// [tensor][element] parameters against a float64 reference, each element as Catch's
// Approx(want).epsilon(epsilon).margin(margin): a strategy's training against serial maths.
template <class T, class U>
void require_close(const std::vector<std::vector<T>>& got, const std::vector<std::vector<U>>& want,
                   double epsilon = 2e-5, double margin = 2e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t t = 0; t < want.size(); ++t)
    for (std::size_t j = 0; j < want[t].size(); ++j) {
      CAPTURE(t, j);
      REQUIRE(double(got[t][j]) == Approx(double(want[t][j])).epsilon(epsilon).margin(margin));
    }
}

// got == want up to float64 rounding: max |got - want| <= fraction of the largest |want|
// (at least 1), element by element; NaN fails. Two float64 computations of the same sums.
inline void require_close_to_largest(const std::vector<double>& got, const std::vector<double>& want,
                                     double fraction = 1e-12) {
  REQUIRE(got.size() == want.size());
  double scale = 1;
  for (double v : want) scale = std::max(scale, std::abs(v));
  std::size_t worst = 0;
  double diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::isnan(got[i] - want[i]) ? std::numeric_limits<double>::infinity() : std::abs(got[i] - want[i]);
    if (d > diff) diff = d, worst = i;
  }
  CAPTURE(worst, got[worst], want[worst], scale);
  REQUIRE(diff <= fraction * scale);
}

// Two runs' flat parameters after every step agree to 1e-5, relative to each step's
// largest parameter (two ways of training the same model, e.g. PS and all-reduce, or
// device and host tensors).
template <class T>
void require_trajectories_close(const std::vector<std::vector<T>>& got, const std::vector<std::vector<T>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    double scale = 0;
    for (T v : want[k]) scale = std::max(scale, std::abs(double(v)));
    REQUIRE(got[k].size() == want[k].size());
    for (std::size_t i = 0; i < want[k].size(); ++i) {
      CAPTURE(k, i);
      REQUIRE(double(got[k][i]) == Approx(double(want[k][i])).epsilon(1e-5).margin(1e-5 * scale));
    }
  }
}

}  // namespace gradwire::test
