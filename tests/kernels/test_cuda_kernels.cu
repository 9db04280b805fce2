// CUDA kernels against float64 host references: sizes 0 .. 8M (several grid-stride rounds),
// aligned (vector path) and unaligned (scalar path) operands, NaN-poisoned outputs and canaries.
#include <gradwire/kernels/cuda.cuh>

#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/device_buffer.cuh"
#include "helpers/reference.hpp"

namespace {

namespace gt = gradwire::test;
namespace kc = gradwire::kernels::cuda;
namespace gc = gradwire::cuda;
using gt::require_close;

constexpr std::array<std::size_t, 8> sizes{0, 1, 7, 31, 1000, 4099, 1000003, (std::size_t{1} << 23) + 5};
constexpr std::array<std::size_t, 2> offsets{0, 1};  // 0: 16-byte aligned, vector path; 1: scalar path

// Unit roundoff of the type a kernel stores: the result's last rounding.
template <class T>
constexpr double storage_roundoff() {
  if constexpr (std::is_same_v<T, __half>) return 1.0 / 2048;  // 2^-11
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return 1.0 / 256;  // 2^-8
  else return gt::roundoff<T>;
}

// Below f16's normal range (2^-14) rounding is absolute: at most half its subnormal step.
template <class T>
constexpr double subnormal_step() {
  return std::is_same_v<T, __half> ? 1.0 / (1 << 25) : 0.0;
}

template <class T>
std::vector<T> random_values(gt::random_engine& rng, std::size_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(n);
  for (auto& x : v) x = gc::from_compute<T>(static_cast<gc::compute_t<T>>(rng.uniform(lo, hi)));
  return v;
}

// k inputs of n elements on the device, each at its own misalignment when `offset` is.
template <class T>
struct device_inputs {
  std::vector<std::vector<T>> host;
  std::vector<std::unique_ptr<gt::device_guarded<T>>> device;
  std::vector<const T*> pointers;

  device_inputs(gt::random_engine& rng, int k, std::size_t n, std::size_t offset) {
    for (int j = 0; j < k; ++j) {
      host.push_back(random_values<T>(rng, n));
      device.push_back(std::make_unique<gt::device_guarded<T>>(n, offset ? 1 + j % 3 : 0));
      device.back()->upload(host.back());
      pointers.push_back(device.back()->data());
    }
  }
  std::span<const T* const> span() const { return pointers; }
  bool unchanged() const {
    for (std::size_t j = 0; j < host.size(); ++j) {
      const auto now = device[j]->download();
      for (std::size_t i = 0; i < now.size(); ++i)
        if (gc::to_compute(now[i]) != gc::to_compute(host[j][i])) return false;
      if (!device[j]->intact()) return false;
    }
    return true;
  }
  // The float sum in input order, as every kernel forms it (0 + g0 + g1 + ...).
  double compute_sum(std::size_t i) const {
    gc::compute_t<T> g = 0;
    for (const auto& h : host) g += gc::to_compute(h[i]);
    return static_cast<double>(g);
  }
  double magnitude(std::size_t i) const {
    double s = 0;
    for (const auto& h : host) s += std::abs(static_cast<double>(gc::to_compute(h[i])));
    return s;
  }
};

}  // namespace

TEMPLATE_TEST_CASE("kernels::cuda::sum and average of k buffers against a float64 sum", "[cuda][kernels][sum]", float,
                   double, __half, __nv_bfloat16) {
  using T = TestType;
  using C = gc::compute_t<T>;
  GRADWIRE_TEST_RNG(rng);
  for (const int k : {1, 2, 8, 17})  // 17: more than one launch (max_inputs = 16)
    for (const std::size_t n : sizes)
      for (const std::size_t off : offsets) {
        if (k == 17 && n > 5000) continue;  // the chaining is size-independent
        CAPTURE(k, n, off);
        device_inputs<T> in(rng, k, n, off);
        gt::device_guarded<T> out(n, off);
        for (const bool average : {false, true}) {
          CAPTURE(average);
          out.poison();
          if (average)
            kc::average<T>(in.span(), out.data(), n, nullptr);
          else
            kc::sum<T>(in.span(), out.data(), n, nullptr);
          std::vector<double> want(n), allowed(n);
          const double alpha = average ? static_cast<double>(C(1) / C(k)) : 1.0;
          for (std::size_t i = 0; i < n; ++i) {
            double s = 0;
            for (const auto& h : in.host) s += static_cast<double>(gc::to_compute(h[i]));
            want[i] = alpha * s;
            // One storage rounding per launch: sums of more than max_inputs chain launches.
            const int launches = 1 + (k > kc::max_inputs ? (k - 2) / (kc::max_inputs - 1) : 0);
            allowed[i] = alpha * in.magnitude(i) * ((k + 2) * gt::roundoff<C> + launches * storage_roundoff<T>());
          }
          require_close(gt::widen_device(out.download()), want, allowed);
          REQUIRE(out.intact());
        }
        REQUIRE(in.unchanged());
      }
}

TEMPLATE_TEST_CASE("kernels::cuda::sum accumulates in place when out is inputs[0]", "[cuda][kernels][sum]", float,
                   __half) {
  using T = TestType;
  using C = gc::compute_t<T>;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : {std::size_t{7}, std::size_t{4099}, std::size_t{1000003}}) {
    CAPTURE(n);
    device_inputs<T> in(rng, 18, n, 0);
    const std::vector<T> first = in.host[0];
    std::vector<const T*> pointers = in.pointers;
    kc::sum<T>(pointers, in.device[0]->data(), n, nullptr);
    std::vector<double> want(n), allowed(n);
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (const auto& h : in.host) s += static_cast<double>(gc::to_compute(h[i]));
      want[i] = s;
      allowed[i] = in.magnitude(i) * (20 * gt::roundoff<C> + 2 * storage_roundoff<T>());  // 18 inputs: 2 launches
    }
    require_close(gt::widen_device(in.device[0]->download()), want, allowed);
    REQUIRE(in.device[0]->intact());
  }
}

TEMPLATE_TEST_CASE("kernels::cuda::scale and axpy", "[cuda][kernels]", float, double, __half, __nv_bfloat16) {
  using T = TestType;
  using C = gc::compute_t<T>;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes)
    for (const std::size_t off : offsets) {
      CAPTURE(n, off);
      const C alpha = static_cast<C>(rng.uniform(-2.0, 2.0));
      const auto x = random_values<T>(rng, n), y = random_values<T>(rng, n);
      gt::device_guarded<T> dx(n, off), dy(n, off);  // off 0: both aligned, the vector path
      dx.upload(x);
      dy.upload(y);
      kc::axpy<T>(alpha, dx.data(), dy.data(), n, nullptr);
      std::vector<double> want(n), allowed(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double a = static_cast<double>(alpha) * gc::to_compute(x[i]), b = gc::to_compute(y[i]);
        want[i] = a + b;
        allowed[i] = (std::abs(a) + std::abs(b)) * (2 * gt::roundoff<C> + storage_roundoff<T>()) + subnormal_step<T>();
      }
      require_close(gt::widen_device(dy.download()), want, allowed);
      kc::scale<T>(dx.data(), alpha, n, nullptr);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = static_cast<double>(alpha) * gc::to_compute(x[i]);
        allowed[i] = std::abs(want[i]) * (gt::roundoff<C> + storage_roundoff<T>()) + subnormal_step<T>();
      }
      require_close(gt::widen_device(dx.download()), want, allowed);
      REQUIRE(dx.intact());
      REQUIRE(dy.intact());
    }
}

TEMPLATE_TEST_CASE("kernels::cuda::sgd_step and momentum_step fuse the average of k gradients", "[cuda][kernels][optim]",
                   float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const int k : {1, 3})
    for (const std::size_t n : sizes)
      for (const std::size_t off : offsets)
        for (const int kind : {0, 1, 2}) {  // sgd, momentum, nesterov
          const double lr = gt::as<T>(rng.uniform(1e-3, 0.5)), wd = gt::as<T>(rng.uniform(0.0, 0.1));
          const double mu = gt::as<T>(rng.uniform(0.5, 0.99));
          const T s = static_cast<T>(1.0 / k);
          CAPTURE(k, n, off, kind, lr, wd, mu);
          device_inputs<T> g(rng, k, n, off);
          const auto p0 = random_values<T>(rng, n), v0 = random_values<T>(rng, n, -0.5, 0.5);
          gt::device_guarded<T> p(n, off), v(n, off ? 2 : 0);
          p.upload(p0);
          v.upload(v0);
          auto want_p = gt::exact<T>(std::span<const T>(p0));
          auto want_v = gt::exact<T>(std::span<const T>(v0));
          for (std::size_t i = 0; i < n; ++i) {
            const double gi = g.compute_sum(i);
            if (kind == 0)
              gt::sgd_reference_step(want_p[i], gi, double(s), {lr, wd}, gt::roundoff<T>);
            else
              gt::momentum_reference_step(want_p[i], want_v[i], gi, double(s), {lr, mu, wd, kind == 2},
                                          gt::roundoff<T>);
          }
          if (kind == 0)
            kc::sgd_step<T>(p.data(), g.span(), n, lr, wd, s, nullptr);
          else
            kc::momentum_step<T>(p.data(), g.span(), v.data(), n, lr, mu, wd, kind == 2, s, nullptr);
          require_close(gt::widen_device(p.download()), want_p);
          if (kind != 0) require_close(gt::widen_device(v.download()), want_v);
          REQUIRE(p.intact());
          REQUIRE(v.intact());
          REQUIRE(g.unchanged());
        }
}

TEMPLATE_TEST_CASE("kernels::cuda::adam_step (Adam and AdamW) fuses the average of k gradients",
                   "[cuda][kernels][optim][adam]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  constexpr std::array<long, 4> steps{1, 2, 7, 1000};
  for (const bool decoupled : {false, true})
    for (const int k : {1, 4})
      for (const std::size_t n : sizes)
        for (const std::size_t off : offsets) {
          const long t = steps[(n + off + k) % steps.size()];
          const T lr = static_cast<T>(rng.uniform(1e-4, 0.1)), b1 = static_cast<T>(rng.uniform(0.5, 0.99)),
                  b2 = static_cast<T>(rng.uniform(0.9, 0.9999)), eps = static_cast<T>(off ? 1e-8 : 0.1),
                  wd = static_cast<T>(rng.uniform(0.0, 0.2));
          const T s = static_cast<T>(1.0 / k);
          CAPTURE(decoupled, k, n, off, t, lr, b1, b2, eps, wd);
          device_inputs<T> g(rng, k, n, off);
          const auto p0 = random_values<T>(rng, n), m0 = random_values<T>(rng, n, -0.5, 0.5),
                     v0 = random_values<T>(rng, n, 0.0, 0.5);
          gt::device_guarded<T> p(n, off), m(n, off ? 3 : 0), v(n, off ? 2 : 0);
          p.upload(p0);
          m.upload(m0);
          v.upload(v0);
          auto want_p = gt::exact<T>(std::span<const T>(p0));
          auto want_m = gt::exact<T>(std::span<const T>(m0));
          auto want_v = gt::exact<T>(std::span<const T>(v0));
          const gt::adam_hyper h{double(lr), double(b1), double(b2), double(eps), double(wd), decoupled};
          for (std::size_t i = 0; i < n; ++i)
            gt::adam_reference_step(want_p[i], want_m[i], want_v[i], g.compute_sum(i), double(s), h, t,
                                    gt::roundoff<T>);
          const auto c = gradwire::kernels::adam_coefficients<T>::make(lr, b1, b2, eps, wd, decoupled, t, s);
          kc::adam_step<T>(p.data(), g.span(), m.data(), v.data(), n, c, nullptr);
          require_close(gt::widen_device(p.download()), want_p);
          require_close(gt::widen_device(m.download()), want_m);
          require_close(gt::widen_device(v.download()), want_v);
          REQUIRE(p.intact());
          REQUIRE(m.intact());
          REQUIRE(v.intact());
          REQUIRE(g.unchanged());
        }
}

TEST_CASE("kernels::cuda fused steps refuse more gradient buffers than one launch takes", "[cuda][kernels]") {
  std::vector<const float*> many(kc::max_inputs + 1, nullptr);
  REQUIRE_THROWS_MATCHES(kc::sgd_step<float>(nullptr, many, 16, 0.1, 0.0, 1.0f, nullptr), gradwire::error,
                         gt::error_matcher(gradwire::errc::invalid_argument, {"at most 16"}));
}

TEMPLATE_TEST_CASE("kernels::cuda::convert rounds float to f16 / bf16 to nearest and widens exactly",
                   "[cuda][kernels][convert]", __half, __nv_bfloat16) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (auto& e : x) e = static_cast<float>(rng.uniform(-100.0, 100.0));
    gt::device_guarded<float> dx(n), back(n, 1);
    gt::device_guarded<T> narrow(n, 1);
    dx.upload(x);
    narrow.poison();
    back.poison();
    kc::convert<float, T>(dx.data(), narrow.data(), n, nullptr);
    kc::convert<T, float>(narrow.data(), back.data(), n, nullptr);
    const auto got = gt::widen_device(narrow.download());
    const auto widened = back.download();
    std::vector<double> want(n), allowed(n);
    std::size_t inexact_widenings = 0;  // one assertion, not one per element (8M of them)
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = x[i];
      // Half an ulp, relative; f16 subnormals (|x| < 2^-14) round to a fixed 2^-25.
      allowed[i] = std::abs(static_cast<double>(x[i])) * storage_roundoff<T>() +
                   (std::is_same_v<T, __half> ? std::ldexp(1.0, -25) : 0.0);
      if (static_cast<double>(widened[i]) != got[i]) ++inexact_widenings;  // widening is exact
    }
    REQUIRE(inexact_widenings == 0);
    const auto c = gt::compare<double>(got, want, allowed);
    INFO(c);
    REQUIRE(c.ok());
    REQUIRE(narrow.intact());
    REQUIRE(back.intact());
  }
  // Round to nearest, ties to even, at known values.
  const std::vector<float> ties = std::is_same_v<T, __half> ? std::vector<float>{1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048}
                                                            : std::vector<float>{1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  const std::vector<double> even = std::is_same_v<T, __half> ? std::vector<double>{1.0, 1.0 + 4.0 / 2048}
                                                             : std::vector<double>{1.0, 1.0 + 4.0 / 256};
  gt::device_guarded<float> dt(2);
  gt::device_guarded<T> nt(2);
  dt.upload(ties);
  kc::convert<float, T>(dt.data(), nt.data(), 2, nullptr);
  REQUIRE(gt::widen_device(nt.download()) == even);
}

TEMPLATE_TEST_CASE("kernels::cuda::squared_norm (CUB) against a float64 sum of squares", "[cuda][kernels][norm]",
                   float, double, __half) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  gc::device_buffer<std::byte> scratch;
  double* out = nullptr;
  gc::check(cudaMalloc(&out, sizeof(double)), "cudaMalloc");
  for (const std::size_t n : sizes) {
    CAPTURE(n);
    const auto x = random_values<T>(rng, n);
    gt::device_guarded<T> dx(n, 1);
    dx.upload(x);
    kc::squared_norm<T>(dx.data(), n, out, scratch, nullptr);
    double got = -1;
    gc::check(cudaMemcpy(&got, out, sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
    // The reference is summed with Neumaier's compensation: a plain serial double sum of
    // 8M squares is itself off by about 1.3e-12 relative (seen on an H100, where the
    // CUB tree was the closer of the two), above the bound below.
    double want = 0, compensation = 0;
    for (const T& e : x) {
      const double term = static_cast<double>(gc::to_compute(e)) * gc::to_compute(e);
      const double sum = want + term;
      compensation += std::abs(want) >= std::abs(term) ? (want - sum) + term : (term - sum) + want;
      want = sum;
    }
    want += compensation;
    CAPTURE(got, want);
    REQUIRE(std::abs(got - want) <= 1e-12 * want + 1e-300);
  }
  (void)cudaFree(out);
}
