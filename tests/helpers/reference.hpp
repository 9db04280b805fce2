// Test support: seeded random data, guarded buffers, float64 references with error bounds, comparisons.
//
// Every test draws fresh random data; the seed goes into the failure report (INFO), and
// GRADWIRE_TEST_SEED=<seed> (or Catch's --rng-seed <seed>) replays a failing run exactly.
// References are computed in float64 from the very values the code under test sees
// (inputs and hyperparameters already rounded to T), so what is left to compare is the
// rounding of the T arithmetic; tolerances are scaled by the magnitudes involved (the
// condition), not by the result alone, so cancellation does not make a test flaky.
#pragma once

#include <catch2/catch.hpp>

#include <gradwire/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace gradwire::test {

// --- seeded randomness ----------------------------------------------------------------

// GRADWIRE_TEST_SEED if set, else Catch's --rng-seed if given, else a fresh seed.
inline std::uint64_t fresh_seed() {
  if (const char* s = std::getenv("GRADWIRE_TEST_SEED"); s != nullptr && *s != '\0')
    return std::strtoull(s, nullptr, 0);
  if (const unsigned catch_seed = Catch::rngSeed(); catch_seed != 0) return catch_seed;
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

class random_engine {
 public:
  explicit random_engine(std::uint64_t seed = fresh_seed()) : seed_(seed), engine_(seed) {}

  std::uint64_t seed() const noexcept { return seed_; }
  std::mt19937_64& engine() noexcept { return engine_; }

  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  // A value of T drawn in [lo, hi); as double, so a reference sees exactly what T holds.
  template <class T>
  T value(double lo, double hi) {
    return static_cast<T>(uniform(lo, hi));
  }
  // Integer in [lo, hi], both ends included.
  template <class I = long>
  I integer(I lo, I hi) {
    return std::uniform_int_distribution<I>(lo, hi)(engine_);
  }
  template <class T>
  void fill(std::span<T> out, double lo = -1.0, double hi = 1.0) {
    for (T& x : out) x = value<T>(lo, hi);
  }
  template <class T>
  std::vector<T> vector(std::size_t n, double lo = -1.0, double hi = 1.0) {
    std::vector<T> v(n);
    fill(std::span<T>(v), lo, hi);
    return v;
  }

 private:
  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

// Declares a random_engine `name` and reports its seed with every failure in scope.
#define GRADWIRE_TEST_RNG(name)      \
  ::gradwire::test::random_engine name; \
  INFO("random seed " << name.seed() << " (replay: GRADWIRE_TEST_SEED=" << name.seed() << ")")

// --- buffers with canaries ------------------------------------------------------------

inline bool is_aligned(const void* p, std::size_t alignment) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// n elements starting `offset` elements past a 64-byte boundary, with canaries on both
// sides: a kernel that writes one element too many (or too few before the start) is
// caught by intact(), one that skips elements by poison() + a NaN-rejecting comparison.
// Independent of gradwire's own allocators on purpose.
template <class T>
class guarded_buffer {
 public:
  static constexpr std::size_t guard = 64;  // elements of canary on each side
  static constexpr std::size_t alignment = 64;

  explicit guarded_buffer(std::size_t n, std::size_t offset = 0)
      : n_(n), storage_(alignment / sizeof(T) + guard + offset + n + guard, canary()) {
    const auto misalignment = reinterpret_cast<std::uintptr_t>(storage_.data()) % alignment;
    begin_ = (alignment - misalignment) % alignment / sizeof(T) + guard + offset;
  }

  static T canary() noexcept { return static_cast<T>(-98765.4375); }  // exact in float and double

  T* data() noexcept { return storage_.data() + begin_; }
  const T* data() const noexcept { return storage_.data() + begin_; }
  std::size_t size() const noexcept { return n_; }
  std::span<T> span() noexcept { return {data(), n_}; }
  std::span<const T> span() const noexcept { return {data(), n_}; }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  std::vector<T> values() const { return {data(), data() + n_}; }

  // Fill the payload with quiet NaN: an element the kernel never writes stays NaN.
  void poison() noexcept { std::fill_n(data(), n_, std::numeric_limits<T>::quiet_NaN()); }

  // True when nothing before or after the payload was written.
  bool intact() const noexcept {
    const T c = canary();
    const auto ok = [c](T x) { return x == c; };
    return std::all_of(storage_.begin(), storage_.begin() + static_cast<std::ptrdiff_t>(begin_), ok) &&
           std::all_of(storage_.begin() + static_cast<std::ptrdiff_t>(begin_ + n_), storage_.end(), ok);
  }

 private:
  std::size_t n_;
  std::size_t begin_ = 0;
  std::vector<T> storage_;
};

// --- rounding and tolerances ----------------------------------------------------------

// Unit roundoff of T, plus float64's own: the reference rounds too.
template <class T>
inline constexpr double roundoff = std::numeric_limits<T>::epsilon() / 2 + std::numeric_limits<double>::epsilon() / 2;

// Relative tolerance for short elementwise expressions, measured against the sum of the
// magnitudes of the terms (so cancellation is accounted for): ~16x the unit roundoff.
template <class T>
inline constexpr double tolerance = std::is_same_v<T, float> ? 1e-6 : 1e-14;

// x as T holds it, back in float64: hyperparameters pass through T before a kernel sees them.
template <class T>
double as(double x) {
  return static_cast<double>(static_cast<T>(x));
}

template <class T>
std::vector<double> widen(std::span<const T> x) {
  return {x.begin(), x.end()};
}

// |got - want| / |want|; infinite for NaN, and for any difference from an exact zero.
inline double relative_error(double got, double want) {
  const double diff = std::abs(got - want);
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  if (diff == 0) return 0;
  return want == 0 ? std::numeric_limits<double>::infinity() : diff / std::abs(want);
}

// --- comparisons ----------------------------------------------------------------------

// The worst element of a comparison: its error as a fraction of what was allowed.
struct comparison {
  double worst = 0;  // max |got - want| / allowed; <= 1 passes, NaN/unwritten gives inf
  std::size_t index = 0, count = 0;
  double got = 0, want = 0, allowed = 0;
  bool ok() const noexcept { return worst <= 1.0; }

  friend std::ostream& operator<<(std::ostream& os, const comparison& c) {
    return os << "worst of " << c.count << " elements at [" << c.index << "]: got " << c.got << ", want " << c.want
              << " (diff " << std::abs(c.got - c.want) << ", allowed " << c.allowed << ", ratio " << c.worst << ")";
  }
};

namespace detail {
inline void account(comparison& c, std::size_t i, double got, double want, double allowed) {
  const double diff = std::abs(got - want);
  double ratio;
  if (std::isnan(diff))
    ratio = std::numeric_limits<double>::infinity();
  else if (diff == 0)
    ratio = 0;
  else
    ratio = allowed > 0 ? diff / allowed : std::numeric_limits<double>::infinity();
  if (ratio > c.worst || i == 0) c = {std::max(c.worst, ratio), i, c.count, got, want, allowed};
}
}  // namespace detail

// got[i] against want[i] with an absolute allowance per element.
template <class T>
comparison compare(std::span<const T> got, std::span<const double> want, std::span<const double> allowed) {
  comparison c;
  c.count = got.size();
  if (got.size() != want.size() || got.size() != allowed.size()) {
    c.worst = std::numeric_limits<double>::infinity();
    return c;
  }
  for (std::size_t i = 0; i < got.size(); ++i) detail::account(c, i, static_cast<double>(got[i]), want[i], allowed[i]);
  return c;
}

// A float64 reference value and a bound on how far a correct implementation in T may
// be from it (first-order rounding-error analysis, carried from step to step).
struct bounded {
  double value = 0;
  double bound = 0;
};

template <class T>
std::vector<bounded> exact(std::span<const T> x) {
  std::vector<bounded> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = {static_cast<double>(x[i]), 0.0};
  return out;
}

// got[i] against want[i].value, allowing `safety` times the tracked bound.
template <class T>
comparison compare(std::span<const T> got, std::span<const bounded> want, double safety = 4.0) {
  comparison c;
  c.count = got.size();
  if (got.size() != want.size()) {
    c.worst = std::numeric_limits<double>::infinity();
    return c;
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    detail::account(c, i, static_cast<double>(got[i]), want[i].value, safety * want[i].bound);
  return c;
}

// --- textbook optimizer updates in float64 (PyTorch semantics) ---------------------------
// One element per call; u is the unit roundoff of the implementation being checked
// (roundoff<T>). Each call advances the bounds together with the values.

struct sgd_hyper {
  double lr, weight_decay;
};

// p -= lr * (s*g + wd*p)
inline void sgd_reference_step(bounded& p, double g, double s, const sgd_hyper& h, double u) {
  const double update = h.lr * (s * g + h.weight_decay * p.value);
  const double magnitude = h.lr * (std::abs(s * g) + h.weight_decay * std::abs(p.value));
  p = {p.value - update, p.bound * (1 + h.lr * h.weight_decay) + 4 * u * (std::abs(p.value) + magnitude)};
}

struct momentum_hyper {
  double lr, momentum, weight_decay;
  bool nesterov;
};

// d = s*g + wd*p;  v = mu*v + d;  p -= lr * (nesterov ? d + mu*v : v)
inline void momentum_reference_step(bounded& p, bounded& v, double g, double s, const momentum_hyper& h, double u) {
  const double mu = h.momentum;
  const double d = s * g + h.weight_decay * p.value;
  const double d_mag = std::abs(s * g) + h.weight_decay * std::abs(p.value);
  const double d_err = h.weight_decay * p.bound + 3 * u * d_mag;
  const double v_new = mu * v.value + d;
  const double v_mag = mu * std::abs(v.value) + d_mag;
  const double v_err = mu * v.bound + d_err + 3 * u * v_mag;
  const double dir = h.nesterov ? d + mu * v_new : v_new;
  const double dir_mag = h.nesterov ? d_mag + mu * v_mag : v_mag;
  const double dir_err = h.nesterov ? d_err + mu * v_err + 3 * u * dir_mag : v_err;
  p = {p.value - h.lr * dir, p.bound + h.lr * dir_err + 3 * u * (std::abs(p.value) + h.lr * dir_mag)};
  v = {v_new, v_err};
}

struct adam_hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: p *= 1 - lr*wd, and wd stays out of the gradient
};

// Adam:  d = s*g + wd*p; m = b1 m + (1-b1) d; v = b2 v + (1-b2) d^2;
//        mhat = m / (1-b1^t); vhat = v / (1-b2^t); p -= lr * mhat / (sqrt(vhat) + eps)
// AdamW: p *= 1 - lr*wd, then the above with d = s*g.
// The bound grows with 1/(1-b^t): bias correction at small t magnifies the rounding of b^t.
inline void adam_reference_step(bounded& p, bounded& m, bounded& v, double g, double s, const adam_hyper& h, long t,
                                double u) {
  const double l2 = h.decoupled ? 0.0 : h.weight_decay;
  const double keep = h.decoupled ? 1.0 - h.lr * h.weight_decay : 1.0;
  const double d = s * g + l2 * p.value;
  const double d_mag = std::abs(s * g) + l2 * std::abs(p.value);
  const double d_err = l2 * p.bound + 3 * u * d_mag;
  const double m_new = h.beta1 * m.value + (1 - h.beta1) * d;
  const double m_mag = h.beta1 * std::abs(m.value) + (1 - h.beta1) * d_mag;
  const double m_err = h.beta1 * m.bound + (1 - h.beta1) * d_err + 3 * u * m_mag;
  const double v_new = h.beta2 * v.value + (1 - h.beta2) * d * d;
  const double v_mag = h.beta2 * std::abs(v.value) + (1 - h.beta2) * d_mag * d_mag;
  const double v_err = h.beta2 * v.bound + (1 - h.beta2) * (2 * std::abs(d) + d_err) * d_err + 4 * u * v_mag;

  const double pow1 = std::pow(h.beta1, static_cast<double>(t)), pow2 = std::pow(h.beta2, static_cast<double>(t));
  const double bc1 = 1 - pow1, bc2 = 1 - pow2;
  const double m_hat = m_new / bc1, v_hat = v_new / bc2;
  const double den = std::sqrt(v_hat) + h.eps;
  const double update = h.lr * m_hat / den;

  const double bc1_rel = 2 * u * pow1 / bc1 + 2 * u, bc2_rel = 2 * u * pow2 / bc2 + 2 * u;
  const double sqrt_err = (std::sqrt(v_new + v_err) - std::sqrt(v_new)) / std::sqrt(bc2) +
                          std::sqrt(v_hat) * (bc2_rel / 2 + 3 * u);
  const double den_err = sqrt_err + u * den;
  const double update_err =
      h.lr / bc1 * (m_err + std::abs(m_new) * (bc1_rel + 3 * u)) / den + std::abs(update) * den_err / den;
  const double keep_err = h.decoupled ? 2 * u : 0.0;
  p = {keep * p.value - update, keep * p.bound + std::abs(p.value) * keep_err + update_err +
                                    3 * u * (std::abs(keep * p.value) + std::abs(update))};
  m = {m_new, m_err};
  v = {v_new, v_err};
}

// --- errors ---------------------------------------------------------------------------

// Matches a gradwire::error of one kind whose message contains every needle.
class error_matcher : public Catch::MatcherBase<gradwire::error> {
 public:
  error_matcher(gradwire::errc kind, std::vector<std::string> needles) : kind_(kind), needles_(std::move(needles)) {}

  bool match(const gradwire::error& e) const override {
    const std::string what = e.what();
    return e.kind() == kind_ && e.code() == make_error_code(kind_) &&
           std::all_of(needles_.begin(), needles_.end(),
                       [&](const std::string& n) { return what.find(n) != std::string::npos; });
  }
  std::string describe() const override {
    std::string s = "is a gradwire::error of kind \"" + make_error_code(kind_).message() + "\"";
    for (const auto& n : needles_) s += ", message contains \"" + n + "\"";
    return s;
  }

 private:
  gradwire::errc kind_;
  std::vector<std::string> needles_;
};

inline error_matcher is_error(gradwire::errc kind, std::vector<std::string> needles = {}) {
  return {kind, std::move(needles)};
}

}  // namespace gradwire::test

// Failure reports show the error's kind and message instead of "{?}".
template <>
struct Catch::StringMaker<gradwire::error> {
  static std::string convert(const gradwire::error& e) {
    return "gradwire::error(" + e.code().message() + "): " + e.what();
  }
};
