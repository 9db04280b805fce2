// The cost of the non-finite gradient check (strategy::check_finite_gradients): the scan alone
// (kernels::first_non_finite) and a one_device SGD step with the check off and on, per size.
//   finite_check [-b min_elements] [-e max_elements] [-f factor] [-n runs] [-o out.csv]
// Prints size | check | step off | step on | added (medians of n runs, microseconds) and
// writes the same as CSV. Never pass/fail: see docs/errors.md for the figures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gradwire/gradwire.hpp>

namespace gw = gradwire;
using clock_type = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}
template <class F>
double time_us(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t min_n = 1024, max_n = std::size_t{64} << 20, factor = 4;
  int runs = 51;
  std::string csv = "finite_check.csv";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "-b") min_n = std::stoull(value);
    else if (flag == "-e") max_n = std::stoull(value);
    else if (flag == "-f") factor = std::stoull(value);
    else if (flag == "-n") runs = std::stoi(value);
    else if (flag == "-o") csv = value;
    else {
      std::fprintf(stderr, "finite_check: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::FILE* out = std::fopen(csv.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "finite_check: cannot write %s\n", csv.c_str());
    return 1;
  }
  std::fprintf(out, "elements,bytes,check_us,step_off_us,step_on_us,added_pct,check_gbps\n");
  std::printf("# f32, one_device<sgd>, medians of %d runs (interleaved off/on)\n", runs);
  std::printf("%12s %12s %10s %11s %11s %8s %10s\n", "elements", "bytes", "check(us)", "step off", "step on", "added",
              "check GB/s");
  for (std::size_t n = min_n; n <= max_n; n *= factor) {
    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{n});
    gw::one_device<gw::host_tensor<float>, gw::optim::sgd> s(std::move(params), gw::optim::sgd({.lr = 1e-6}));
    const std::vector<std::vector<float>> grads{std::vector<float>(n, 0.5f)};
    // Fewer runs for the largest sizes keep the sweep to minutes; never fewer than 11.
    const int r = std::max(11, std::min(runs, static_cast<int>((std::size_t{1} << 30) / (n * 4) + 1)));
    std::vector<double> check, off, on;
    for (int k = 0; k < 3; ++k) s.step(grads);  // warm: first touch, caches
    volatile std::size_t sink = 0;
    for (int k = 0; k < r; ++k) {
      check.push_back(time_us([&] { sink = gw::kernels::first_non_finite(grads[0].data(), n); }));
      s.check_finite_gradients(false);
      off.push_back(time_us([&] { s.step(grads); }));
      s.check_finite_gradients(true);
      on.push_back(time_us([&] { s.step(grads); }));
    }
    (void)sink;
    const double c = median(check), a = median(off), b = median(on);
    const double pct = 100.0 * (b - a) / a, gbps = n * 4 / (c * 1e3);
    std::printf("%12zu %12zu %10.2f %11.2f %11.2f %7.1f%% %10.1f\n", n, n * 4, c, a, b, pct, gbps);
    std::fprintf(out, "%zu,%zu,%.3f,%.3f,%.3f,%.2f,%.2f\n", n, n * 4, c, a, b, pct, gbps);
  }
  std::fclose(out);
  return 0;
}
