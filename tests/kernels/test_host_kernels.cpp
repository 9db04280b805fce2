// Host kernels against serial float64 references: sizes 0..4099 (several sum blocks),
// starts 0..3 elements past a 64-byte boundary, NaN-poisoned outputs and canaries.
#include <gradwire/kernels/host.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/reference.hpp"

namespace {

namespace gt = gradwire::test;
namespace kn = gradwire::kernels;
using gt::require_close;

constexpr std::array<std::size_t, 6> sizes{0, 1, 7, 31, 1000, 4099};
constexpr std::array<std::size_t, 4> offsets{0, 1, 2, 3};

// Operands start at different misalignments, so no loop can rely on them sharing one.
constexpr std::size_t shifted(std::size_t offset, std::size_t by) { return (offset + by) % offsets.size(); }

}  // namespace

TEMPLATE_TEST_CASE("kernels::add(dst, src) accumulates src into dst", "[kernels][add]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      CAPTURE(n, off);
      gt::guarded_buffer<T> dst(n, off), src(n, shifted(off, 1));
      rng.fill(dst.span());
      rng.fill(src.span());
      const auto src_before = src.values();
      std::vector<double> want(n), allowed(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double a = dst[i], b = src[i];
        want[i] = a + b;
        allowed[i] = gt::tolerance<T> * (std::abs(a) + std::abs(b));
      }
      kn::add(dst.data(), std::as_const(src).data(), n);
      require_close<T>(dst.span(), want, allowed);
      REQUIRE(dst.intact());
      REQUIRE(src.intact());
      REQUIRE(src.values() == src_before);
    }
}

TEMPLATE_TEST_CASE("kernels::add(dst, a, b) writes a + b into dst", "[kernels][add]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      CAPTURE(n, off);
      gt::guarded_buffer<T> dst(n, off), a(n, shifted(off, 1)), b(n, shifted(off, 2));
      rng.fill(a.span());
      rng.fill(b.span());
      dst.poison();
      const auto a_before = a.values(), b_before = b.values();
      std::vector<double> want(n), allowed(n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = double(a[i]) + double(b[i]);
        allowed[i] = gt::tolerance<T> * (std::abs(double(a[i])) + std::abs(double(b[i])));
      }
      kn::add(dst.data(), std::as_const(a).data(), std::as_const(b).data(), n);
      require_close<T>(dst.span(), want, allowed);
      REQUIRE(dst.intact());
      REQUIRE(a.intact());
      REQUIRE(b.intact());
      REQUIRE(a.values() == a_before);
      REQUIRE(b.values() == b_before);
    }
}

TEMPLATE_TEST_CASE("kernels::scale multiplies in place", "[kernels][scale]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      const T alpha = rng.value<T>(-3.0, 3.0);
      CAPTURE(n, off, alpha);
      gt::guarded_buffer<T> x(n, off);
      rng.fill(x.span());
      std::vector<double> want(n), allowed(n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = double(alpha) * double(x[i]);
        allowed[i] = gt::tolerance<T> * std::abs(want[i]);
      }
      kn::scale(x.data(), alpha, n);
      require_close<T>(x.span(), want, allowed);
      REQUIRE(x.intact());
    }
}

TEMPLATE_TEST_CASE("kernels::axpy adds alpha * x into y", "[kernels][axpy]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      const T alpha = rng.value<T>(-3.0, 3.0);
      CAPTURE(n, off, alpha);
      gt::guarded_buffer<T> x(n, shifted(off, 3)), y(n, off);
      rng.fill(x.span());
      rng.fill(y.span());
      const auto x_before = x.values();
      std::vector<double> want(n), allowed(n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = double(y[i]) + double(alpha) * double(x[i]);
        allowed[i] = gt::tolerance<T> * (std::abs(double(y[i])) + std::abs(double(alpha) * double(x[i])));
      }
      kn::axpy(alpha, std::as_const(x).data(), y.data(), n);
      require_close<T>(y.span(), want, allowed);
      REQUIRE(x.intact());
      REQUIRE(y.intact());
      REQUIRE(x.values() == x_before);
    }
}

namespace {

// k random inputs, each at its own misalignment.
template <class T>
std::vector<gt::guarded_buffer<T>> random_inputs(gt::random_engine& rng, std::size_t k, std::size_t n,
                                                 std::size_t off) {
  std::vector<gt::guarded_buffer<T>> in;
  in.reserve(k);
  for (std::size_t j = 0; j < k; ++j) {
    in.emplace_back(n, shifted(off, j + 1));
    rng.fill(in.back().span());
  }
  return in;
}

// alpha * (in[0] + ... + in[k-1]) in float64; allowed error scales with alpha * sum |in[j]|.
template <class T>
void reference_sum(const std::vector<gt::guarded_buffer<T>>& in, std::size_t n, double alpha,
                   std::vector<double>& want, std::vector<double>& allowed) {
  want.assign(n, 0.0);
  allowed.assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double s = 0, magnitude = 0;
    for (const auto& b : in) {
      s += b[i];
      magnitude += std::abs(double(b[i]));
    }
    want[i] = alpha * s;
    allowed[i] = gt::tolerance<T> * std::abs(alpha) * magnitude;
  }
}

template <class T>
std::vector<const T*> pointers(const std::vector<gt::guarded_buffer<T>>& in) {
  std::vector<const T*> p;
  for (const auto& b : in) p.push_back(b.data());
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("kernels::sum of k buffers into a separate output", "[kernels][sum]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t k : {0, 1, 2, 3, 8})
    for (const bool unit_alpha : {true, false})
      for (const std::size_t n : sizes)
        for (const std::size_t off : offsets) {
          const T alpha = unit_alpha ? T(1) : rng.value<T>(-2.0, 2.0);
          CAPTURE(k, n, off, alpha);
          auto in = random_inputs<T>(rng, k, n, off);
          std::vector<std::vector<T>> before;
          for (const auto& b : in) before.push_back(b.values());
          gt::guarded_buffer<T> out(n, off);
          out.poison();
          std::vector<double> want, allowed;
          reference_sum(in, n, double(alpha), want, allowed);  // k == 0: an empty sum is 0
          const auto ptrs = pointers(in);
          kn::sum<T>(ptrs, out.data(), n, alpha);
          require_close<T>(out.span(), want, allowed);
          REQUIRE(out.intact());
          for (std::size_t j = 0; j < k; ++j) {
            CAPTURE(j);
            REQUIRE(in[j].intact());
            REQUIRE(in[j].values() == before[j]);
          }
        }
}

TEMPLATE_TEST_CASE("kernels::sum in place (out == inputs[0])", "[kernels][sum]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t k : {1, 2, 3, 8})
    for (const bool unit_alpha : {true, false})
      for (const std::size_t n : sizes)
        for (const std::size_t off : offsets) {
          const T alpha = unit_alpha ? T(1) : rng.value<T>(-2.0, 2.0);
          CAPTURE(k, n, off, alpha);
          auto in = random_inputs<T>(rng, k, n, off);
          std::vector<std::vector<T>> before;
          for (const auto& b : in) before.push_back(b.values());
          std::vector<double> want, allowed;
          reference_sum(in, n, double(alpha), want, allowed);
          const auto ptrs = pointers(in);
          kn::sum<T>(ptrs, in[0].data(), n, alpha);
          require_close<T>(in[0].span(), want, allowed);
          for (std::size_t j = 0; j < k; ++j) {
            CAPTURE(j);
            REQUIRE(in[j].intact());
            if (j > 0) REQUIRE(in[j].values() == before[j]);
          }
        }
}

TEMPLATE_TEST_CASE("kernels::average of k buffers, separate and in place", "[kernels][average]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t k : {0, 1, 2, 3, 8})
    for (const bool in_place : {false, true})
      for (const std::size_t n : sizes)
        for (const std::size_t off : offsets) {
          if (in_place && k == 0) continue;
          CAPTURE(k, in_place, n, off);
          auto in = random_inputs<T>(rng, k, n, off);
          std::vector<std::vector<T>> before;
          for (const auto& b : in) before.push_back(b.values());
          // The mean of no inputs is documented as all zeros (average forwards to sum).
          std::vector<double> want, allowed;
          reference_sum(in, n, k == 0 ? 1.0 : 1.0 / double(k), want, allowed);
          gt::guarded_buffer<T> separate(n, off);
          separate.poison();
          T* out = in_place ? in[0].data() : separate.data();
          const auto ptrs = pointers(in);
          kn::average<T>(ptrs, out, n);
          require_close<T>(std::span<const T>(out, n), want, allowed);
          REQUIRE(separate.intact());
          for (std::size_t j = 0; j < k; ++j) {
            CAPTURE(j);
            REQUIRE(in[j].intact());
            if (j > 0 || !in_place) REQUIRE(in[j].values() == before[j]);
          }
        }
}

TEMPLATE_TEST_CASE("kernels::sgd_step: p -= lr * (s*g + wd*p)", "[kernels][sgd]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      const T lr = rng.value<T>(1e-3, 0.5);
      const T wd = off % 2 ? rng.value<T>(0.0, 0.2) : T(0);
      const T s = off < 2 ? T(1) : rng.value<T>(0.05, 2.0);
      CAPTURE(n, off, lr, wd, s);
      gt::guarded_buffer<T> p(n, off), g(n, shifted(off, 1));
      rng.fill(p.span());
      rng.fill(g.span());
      const auto g_before = g.values();
      auto want = gt::exact<T>(p.span());
      for (std::size_t i = 0; i < n; ++i)
        gt::sgd_reference_step(want[i], g[i], s, {double(lr), double(wd)}, gt::roundoff<T>);
      kn::sgd_step(p.data(), std::as_const(g).data(), n, lr, wd, s);
      require_close<T>(p.span(), want);
      REQUIRE(p.intact());
      REQUIRE(g.intact());
      REQUIRE(g.values() == g_before);
    }
}

TEMPLATE_TEST_CASE("kernels::momentum_step, plain and Nesterov", "[kernels][momentum]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const bool nesterov : {false, true})
    for (const bool runtime_flag : {false, true})
      for (const std::size_t n : sizes)
        for (const std::size_t off : offsets) {
          const T lr = rng.value<T>(1e-3, 0.5), mu = rng.value<T>(0.0, 0.99);
          const T wd = off % 2 ? rng.value<T>(0.0, 0.2) : T(0);
          const T s = off < 2 ? T(1) : rng.value<T>(0.05, 2.0);
          CAPTURE(nesterov, runtime_flag, n, off, lr, mu, wd, s);
          gt::guarded_buffer<T> p(n, off), g(n, shifted(off, 1)), v(n, shifted(off, 2));
          rng.fill(p.span());
          rng.fill(g.span());
          rng.fill(v.span());
          const auto g_before = g.values();
          auto want_p = gt::exact<T>(p.span());
          auto want_v = gt::exact<T>(v.span());
          const gt::momentum_hyper h{double(lr), double(mu), double(wd), nesterov};
          for (std::size_t i = 0; i < n; ++i)
            gt::momentum_reference_step(want_p[i], want_v[i], g[i], s, h, gt::roundoff<T>);
          if (runtime_flag)
            kn::momentum_step(p.data(), std::as_const(g).data(), v.data(), n, lr, mu, wd, nesterov, s);
          else if (nesterov)
            kn::momentum_step<T, true>(p.data(), g.data(), v.data(), n, lr, mu, wd, s);
          else
            kn::momentum_step<T, false>(p.data(), g.data(), v.data(), n, lr, mu, wd, s);
          require_close<T>(p.span(), want_p);
          require_close<T>(v.span(), want_v);
          REQUIRE(p.intact());
          REQUIRE(v.intact());
          REQUIRE(g.intact());
          REQUIRE(g.values() == g_before);
        }
}

TEMPLATE_TEST_CASE("kernels::adam_coefficients::make matches the bias corrections", "[kernels][adam]", float,
                   double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const bool decoupled : {false, true})
    for (const long t : {1L, 2L, 3L, 10L, 1000L, 100000L}) {
      const T lr = rng.value<T>(1e-4, 0.1), b1 = rng.value<T>(0.5, 0.99), b2 = rng.value<T>(0.9, 0.9999);
      const T eps = rng.value<T>(1e-9, 1e-3), wd = rng.value<T>(0.0, 0.1), s = rng.value<T>(0.1, 2.0);
      CAPTURE(decoupled, t, lr, b1, b2, eps, wd, s);
      const auto c = kn::adam_coefficients<T>::make(lr, b1, b2, eps, wd, decoupled, t, s);
      const double pow1 = std::pow(double(b1), double(t)), pow2 = std::pow(double(b2), double(t));
      const double u = gt::roundoff<T>;
      // Computed in double (as PyTorch does), then rounded to T once: double's rounding
      // of b^t is magnified by 1 / (1 - b^t), T's is not. (Computing in T, as before,
      // missed this bound by up to 1e-4 in float.)
      const double ud = 0x1p-53;
      const double rel1 = 2 * u + 4 * ud * (1 + pow1 / (1 - pow1)), rel2 = 2 * u + 4 * ud * (1 + pow2 / (1 - pow2));
      CHECK(c.beta1 == b1);
      CHECK(c.beta2 == b2);
      CHECK(c.eps == eps);
      CHECK(c.grad_scale == s);
      CHECK(gt::relative_error(c.step_size, double(lr) / (1 - pow1)) <= rel1);
      CHECK(gt::relative_error(c.inv_sqrt_bc2, 1 / std::sqrt(1 - pow2)) <= rel2);
      CHECK(c.l2 == (decoupled ? T(0) : wd));
      CHECK(gt::relative_error(c.decay_keep, decoupled ? 1 - double(lr) * double(wd) : 1.0) <= 4 * u);
    }
}

TEMPLATE_TEST_CASE("kernels::adam_step, Adam and AdamW coefficients", "[kernels][adam]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  constexpr std::array<long, 4> steps{1, 2, 7, 1000};
  constexpr std::array<double, 3> epsilons{1e-8, 1e-4, 0.1};  // large eps: a misplaced eps shows
  for (const bool decoupled : {false, true})
    for (const std::size_t n : sizes)
      for (const std::size_t off : offsets) {
        const long t = steps[off];
        const T lr = rng.value<T>(1e-4, 0.1), b1 = rng.value<T>(0.5, 0.99), b2 = rng.value<T>(0.9, 0.9999);
        const T eps = T(epsilons[(n + off) % epsilons.size()]);
        const T wd = rng.value<T>(0.0, 0.2);
        const T s = off % 2 ? T(1) : rng.value<T>(0.05, 2.0);
        CAPTURE(decoupled, n, off, t, lr, b1, b2, eps, wd, s);
        gt::guarded_buffer<T> p(n, off), g(n, shifted(off, 1)), m(n, shifted(off, 2)), v(n, shifted(off, 3));
        rng.fill(p.span());
        rng.fill(g.span());
        rng.fill(m.span(), -0.5, 0.5);
        rng.fill(v.span(), 0.0, 0.5);  // a second moment is never negative
        const auto g_before = g.values();
        auto want_p = gt::exact<T>(p.span());
        auto want_m = gt::exact<T>(m.span());
        auto want_v = gt::exact<T>(v.span());
        const gt::adam_hyper h{double(lr), double(b1), double(b2), double(eps), double(wd), decoupled};
        for (std::size_t i = 0; i < n; ++i)
          gt::adam_reference_step(want_p[i], want_m[i], want_v[i], g[i], s, h, t, gt::roundoff<T>);
        const auto c = kn::adam_coefficients<T>::make(lr, b1, b2, eps, wd, decoupled, t, s);
        kn::adam_step(p.data(), std::as_const(g).data(), m.data(), v.data(), n, c);
        require_close<T>(p.span(), want_p);
        require_close<T>(m.span(), want_m);
        require_close<T>(v.span(), want_v);
        REQUIRE(p.intact());
        REQUIRE(m.intact());
        REQUIRE(v.intact());
        REQUIRE(g.intact());
        REQUIRE(g.values() == g_before);
      }
}

// Denormal optimizer state (the moments of a parameter whose gradient is always zero) is
// flushed to zero inside the step kernels, and the caller's floating-point mode survives.
TEMPLATE_TEST_CASE("optimizer kernels flush denormal state to zero and restore the caller's mode",
                   "[kernels][denormals]", float, double) {
  using T = TestType;
  if (!kn::flush_denormals::supported) {
    WARN("no flush-to-zero control on this architecture: nothing to check");
    return;
  }
  const T tiny = std::numeric_limits<T>::denorm_min() * T(1000);  // denormal, far from the smallest
  REQUIRE(std::fpclassify(tiny) == FP_SUBNORMAL);
  const bool caller_flushes = GENERATE(false, true);
  std::optional<kn::flush_denormals> callers_mode;
  if (caller_flushes) callers_mode.emplace();
  REQUIRE(kn::flush_denormals::active() == caller_flushes);

  constexpr std::size_t n = 37;
  std::vector<T> p(n, T(1)), g(n, T(0)), m(n, tiny), v(n, tiny), velocity(n, tiny);
  const auto c = kn::adam_coefficients<T>::make(1e-3, 0.9, 0.999, 1e-8, 0.0, false, 5, T(1));
  kn::adam_step(p.data(), g.data(), m.data(), v.data(), n, c);
  kn::momentum_step(p.data(), g.data(), velocity.data(), n, T(0.1), T(0.9), T(0), false, T(1));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    // Without the flush, b1 * m and mu * velocity stay denormal (0.9 * tiny != 0).
    REQUIRE(m[i] == T(0));
    REQUIRE(v[i] == T(0));
    REQUIRE(velocity[i] == T(0));
    REQUIRE(p[i] == T(1));  // a denormal update of 1 is no change either way
  }
  REQUIRE(kn::flush_denormals::active() == caller_flushes);
  // Denormals outside the kernels keep their meaning when the caller did not flush.
  volatile T x = tiny;
  REQUIRE((x * T(0.5) != T(0)) == !caller_flushes);
}
