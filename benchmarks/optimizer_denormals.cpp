// Optimizer step time with denormal state against normal state (benchmarks/optimizer_denormals.sh).
//
// The case: a parameter whose gradient is always zero (the image border of an MLP's first
// layer) has moments that decay by beta each step, into denormal floats after a few hundred
// steps. Each state is restored before every timed step, so every step sees the same mix.
// Rows: gradwire's kernels with normal state, with a share of the state denormal, and the
// same formula as a plain loop in the caller's floating-point mode (what the kernels were
// before they flushed denormals). Prints a table and optionally a CSV; never fails on time.
#include <gradwire/kernels/host.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace kn = gradwire::kernels;
using clock_type = std::chrono::steady_clock;

struct options {
  std::size_t n = 235'146;  // the demo's Fashion-MNIST MLP, 784-256-128-10
  double denormal_share = 1.0 / 3.0;
  int repeats = 51;
  std::string csv;
};

struct state {
  std::vector<float> p, g, m, v;
};

// Normal-magnitude state; then the first `share` of the elements get a zero gradient and
// moments in the denormal range, as after many steps without a gradient.
state make_state(std::size_t n, double share, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  state s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng) * 0.05f;
    s.g[i] = normal(rng) * 1e-2f;
    s.m[i] = normal(rng) * 1e-3f;
    s.v[i] = std::abs(normal(rng)) * 1e-6f;
  }
  const auto denormal = static_cast<std::size_t>(share * static_cast<double>(n));
  const float tiny = std::numeric_limits<float>::min();  // smallest normal; below it is denormal
  for (std::size_t i = 0; i < denormal; ++i) {
    s.g[i] = 0.f;
    s.m[i] = tiny * 0.25f;
    s.v[i] = tiny * 0.01f;
  }
  return s;
}

// Adam's formula as a plain loop without the flush scope: the kernel as it was.
void adam_without_flush(state& s, const kn::adam_coefficients<float>& c) {
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const float d = c.grad_scale * s.g[i] + c.l2 * s.p[i];
    const float mi = c.beta1 * s.m[i] + (1.f - c.beta1) * d;
    const float vi = c.beta2 * s.v[i] + (1.f - c.beta2) * d * d;
    s.m[i] = mi;
    s.v[i] = vi;
    s.p[i] = c.decay_keep * s.p[i] - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
  }
}

void momentum_without_flush(state& s, float lr, float mu) {
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const float vi = mu * s.m[i] + s.g[i];
    s.m[i] = vi;
    s.p[i] -= lr * vi;
  }
}

// Median over `repeats` single steps, each from a fresh copy of `initial`, after untimed
// steps that bring the caches and the clock up (the first configuration timed was
// otherwise 1.5x slower than the same one timed later).
template <class Step>
double median_ms(const state& initial, int repeats, Step&& step) {
  constexpr int warmup = 5;
  state s = initial;
  std::vector<double> ms;
  for (int r = -warmup; r < repeats; ++r) {
    std::copy(initial.m.begin(), initial.m.end(), s.m.begin());
    std::copy(initial.v.begin(), initial.v.end(), s.v.begin());
    std::copy(initial.p.begin(), initial.p.end(), s.p.begin());
    const auto t0 = clock_type::now();
    step(s);
    if (r >= 0) ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "optimizer_denormals: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") {
      o.n = std::strtoull(next(), nullptr, 10);
    } else if (a == "--denormal-share") {
      o.denormal_share = std::strtod(next(), nullptr);
    } else if (a == "--repeats") {
      o.repeats = std::atoi(next());
    } else if (a == "--csv") {
      o.csv = next();
    } else {
      std::printf(
          "usage: optimizer_denormals [--n ELEMENTS] [--denormal-share F] [--repeats R] [--csv FILE]\n"
          "  times one Adam and one momentum step over ELEMENTS floats (default 235146) with normal state and\n"
          "  with the share F (default 1/3) of the state denormal; median of R steps (default 51)\n");
      std::exit(a == "-h" || a == "--help" ? 0 : 2);
    }
  }
  if (o.n == 0 || o.repeats < 1 || !(o.denormal_share >= 0 && o.denormal_share <= 1)) {
    std::fprintf(stderr, "optimizer_denormals: need --n >= 1, --repeats >= 1, 0 <= --denormal-share <= 1\n");
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::mt19937_64 rng(1);
  const state normal = make_state(o.n, 0.0, rng);
  const state denormal = make_state(o.n, o.denormal_share, rng);
  const auto c = kn::adam_coefficients<float>::make(1e-3, 0.9, 0.999, 1e-8, 0.0, false, 1000, 1.f);
  const float lr = 0.01f, mu = 0.9f;

  auto adam = [&](state& s) { kn::adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), s.p.size(), c); };
  auto momentum = [&](state& s) {
    kn::momentum_step(s.p.data(), s.g.data(), s.m.data(), s.p.size(), lr, mu, 0.f, false, 1.f);
  };
  auto adam_plain = [&](state& s) { adam_without_flush(s, c); };
  auto momentum_plain = [&](state& s) { momentum_without_flush(s, lr, mu); };

  struct row {
    const char* optimizer;
    const char* kernel;
    double normal_ms, denormal_ms;
  };
  std::vector<row> rows{
      {"adam", "gradwire", median_ms(normal, o.repeats, adam), median_ms(denormal, o.repeats, adam)},
      {"adam", "no flush", median_ms(normal, o.repeats, adam_plain), median_ms(denormal, o.repeats, adam_plain)},
      {"momentum", "gradwire", median_ms(normal, o.repeats, momentum), median_ms(denormal, o.repeats, momentum)},
      {"momentum", "no flush", median_ms(normal, o.repeats, momentum_plain),
       median_ms(denormal, o.repeats, momentum_plain)},
  };

  std::printf("# one optimizer step over %zu floats, %.0f%% of the state denormal in the second column; "
              "median of %d steps\n",
              o.n, 100.0 * o.denormal_share, o.repeats);
  std::printf("# flush-to-zero supported here: %s\n", kn::flush_denormals::supported ? "yes" : "no");
  std::printf("%10s %10s %12s %14s %10s\n", "optimizer", "kernel", "normal ms", "denormal ms", "ratio");
  for (const auto& r : rows)
    std::printf("%10s %10s %12.3f %14.3f %10.2f\n", r.optimizer, r.kernel, r.normal_ms, r.denormal_ms,
                r.denormal_ms / r.normal_ms);
  if (!o.csv.empty()) {
    std::FILE* f = std::fopen(o.csv.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "optimizer_denormals: cannot write %s\n", o.csv.c_str());
      return 1;
    }
    std::fprintf(f, "optimizer,kernel,elements,denormal_share,normal_ms,denormal_ms,ratio\n");
    for (const auto& r : rows)
      std::fprintf(f, "%s,%s,%zu,%g,%.4f,%.4f,%.3f\n", r.optimizer, r.kernel, o.n, o.denormal_share, r.normal_ms,
                   r.denormal_ms, r.denormal_ms / r.normal_ms);
    std::fclose(f);
  }
}
