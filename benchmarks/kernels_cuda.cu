// CUDA kernels against the roofline: bytes moved / time for every kernel beside a device-to-device
// copy measured in the same run, and beside Thrust's simple formulation of the same operation.
//
// Columns: size (elements, float32), kernel, time (us, median of -n launches timed with
// events), bytes (what the operation must read and write at least), GB/s, %copy (GB/s
// as a fraction of the copy's), and thrust-time / ours (above 1: ours faster). Every
// kernel's output is checked once per size against a float64 host computation (#wrong).
// benchmarks/kernels_cuda.sh runs this and PyTorch's kernels on the same GPU.
#include <gradwire/cuda.cuh>

#include "bench_table.hpp"

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/transform.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace gc = gradwire::cuda;
namespace kc = gradwire::kernels::cuda;

struct options {
  std::size_t min_elements = std::size_t{1} << 20;  // -b
  std::size_t max_elements = std::size_t{1} << 28;  // -e (256 M)
  std::size_t factor = 4;                           // -f
  int iters = 20;                                   // -n
  int warmup = 3;                                   // -w
  int k = 8;                                        // -k: buffers summed
  std::string csv;                                  // --csv
};

[[noreturn]] void usage(const char* program, const std::string& error = {}) {
  std::FILE* out = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(out, "%s: %s\n\n", program, error.c_str());
  std::fprintf(out,
               "%s: CUDA kernels against a device-to-device copy (the roofline) and Thrust\n"
               "usage: %s [-b ELEMENTS] [-e ELEMENTS] [-f F] [-n ITERS] [-w WARMUP] [-k BUFFERS] [--csv FILE]\n"
               "  sizes in float32 elements, K/M/G binary suffixes (default 1M .. 256M, factor 4); -k buffers\n"
               "  summed (default 8)\n",
               program, program);
  std::exit(error.empty() ? 0 : 2);
}

// The shared benchmark flag syntax (bench_table.hpp: "-b 64M", "--csv=FILE"), sizes in elements.
options parse(int argc, char** argv) {
  namespace bd = gradwire::bench::detail;
  options o;
  bd::for_each_flag(
      argc, argv,
      [&](std::string_view flag, std::string_view value) {
        if (flag == "-b") return bd::parse_size(value, o.min_elements) && o.min_elements > 0;
        if (flag == "-e") return bd::parse_size(value, o.max_elements);
        if (flag == "-f") return bd::parse_size(value, o.factor) && o.factor >= 2;
        if (flag == "-n") return bd::parse_int(value, o.iters) && o.iters >= 1;
        if (flag == "-w") return bd::parse_int(value, o.warmup) && o.warmup >= 0;
        if (flag == "-k") return bd::parse_int(value, o.k) && o.k >= 1 && o.k <= kc::max_inputs;
        if (flag == "--csv") return o.csv = std::string(value), !o.csv.empty();
        usage(argv[0], "unknown flag " + std::string(flag));
      },
      [&](const std::string& error) { usage(argv[0], error); });
  return o;
}

// Median milliseconds of `iters` launches of f, each timed with its own event pair.
template <class F>
double median_ms(const options& o, cudaStream_t stream, F&& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  std::vector<double> ms;
  gc::event start(true), stop(true);
  for (int i = 0; i < o.iters; ++i) {
    start.record(stream);
    f();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_since(start));
  }
  return gradwire::bench::median(std::move(ms));
}

// Thrust baselines: the formulation a user writes first.
struct thrust_adam {
  float b1, b2, eps, step_size, inv_sqrt_bc2;
  template <class Tuple>
  __device__ void operator()(Tuple t) const {
    float& p = thrust::get<0>(t);
    const float g = thrust::get<1>(t);
    float& m = thrust::get<2>(t);
    float& v = thrust::get<3>(t);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    p -= step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
  }
};
struct thrust_scale {
  float alpha;
  __device__ float operator()(float x) const { return alpha * x; }
};

std::vector<float> download(const float* d, std::size_t n) {
  std::vector<float> h(n);
  gc::check(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return h;
}

struct row {
  std::size_t n;
  std::string kernel;
  double us, bytes, copy_gbs, thrust_us;
  std::size_t wrong;
};

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (gc::device_count() == 0) {
    std::fprintf(stderr, "%s: no CUDA device here; run it on a machine with a GPU\n", argv[0]);
    return 77;
  }
  cudaDeviceProp prop{};
  gc::check(cudaGetDeviceProperties(&prop, gc::current_device()), "cudaGetDeviceProperties");
  std::printf("# kernels_cuda: %s, %d SMs, float32, %d buffers summed, median of %d launches\n", prop.name,
              prop.multiProcessorCount, o.k, o.iters);
  std::printf("# %12s %-24s %10s %12s %8s %7s %10s %8s %6s\n", "size", "kernel", "time(us)", "bytes", "GB/s",
              "%copy", "thrust(us)", "x", "#wrong");

  std::FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  if (!o.csv.empty() && !csv) usage(argv[0], "cannot write " + o.csv);
  if (csv) std::fprintf(csv, "device,elements,kernel,time_us,bytes,gbs,fraction_of_copy,thrust_us,wrong\n");

  gc::stream stream;
  const cudaStream_t s = stream.get();
  std::mt19937 engine(12345);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  int status = 0;

  for (std::size_t n = o.min_elements; n <= o.max_elements; n *= o.factor) {
    const std::size_t bytes = n * sizeof(float);
    // k gradients, parameters, two moments, output and a copy target; filled once per size.
    std::vector<gc::device_buffer<float>> grads;
    for (int j = 0; j < o.k; ++j) grads.emplace_back(s);
    gc::device_buffer<float> p(s), m(s), v(s), out(s), copy(s);
    std::vector<float> host(n);
    std::vector<std::vector<float>> host_grads(o.k);
    for (int j = 0; j < o.k; ++j) {
      for (auto& x : host) x = uniform(engine);
      host_grads[j] = host;
      grads[j].reserve_discard(n);
      gc::check(cudaMemcpy(grads[j].data(), host.data(), bytes, cudaMemcpyHostToDevice), "upload");
    }
    for (auto* b : {&p, &m, &v, &out, &copy}) {
      b->reserve_discard(n);
      gc::check(cudaMemsetAsync(b->data(), 0, bytes, s), "memset");
    }
    std::vector<const float*> inputs;
    for (auto& g : grads) inputs.push_back(g.data());
    const std::span<const float* const> all(inputs), one(inputs.data(), 1);

    std::vector<row> rows;
    const double copy_ms = median_ms(o, s, [&] {
      gc::check(cudaMemcpyAsync(copy.data(), grads[0].data(), bytes, cudaMemcpyDeviceToDevice, s), "copy");
    });
    const double copy_gbs = 2.0 * bytes / (copy_ms * 1e6);
    rows.push_back({n, "copy (cudaMemcpy d2d)", copy_ms * 1e3, 2.0 * bytes, copy_gbs, 0, 0});

    // sum of k: ours, then k-1 thrust::transform passes (plus)
    const double sum_ms = median_ms(o, s, [&] { kc::sum<float>(all, out.data(), n, s); });
    std::size_t wrong = 0;
    {
      const auto got = download(out.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0, mag = 0;
        for (int j = 0; j < o.k; ++j) want += host_grads[j][i], mag += std::abs(host_grads[j][i]);
        if (!(std::abs(got[i] - want) <= 1e-6 * (o.k + 1) * mag)) ++wrong;
      }
    }
    const double thrust_sum_ms = median_ms(o, s, [&] {
      auto policy = thrust::cuda::par.on(s);
      thrust::transform(policy, thrust::device_pointer_cast(grads[0].data()),
                        thrust::device_pointer_cast(grads[0].data() + n), thrust::device_pointer_cast(grads[1 % o.k].data()),
                        thrust::device_pointer_cast(out.data()), thrust::plus<float>());
      for (int j = 2; j < o.k; ++j)
        thrust::transform(policy, thrust::device_pointer_cast(out.data()), thrust::device_pointer_cast(out.data() + n),
                          thrust::device_pointer_cast(grads[j].data()), thrust::device_pointer_cast(out.data()),
                          thrust::plus<float>());
    });
    rows.push_back({n, "sum k=" + std::to_string(o.k), sum_ms * 1e3, double(o.k + 1) * bytes, copy_gbs,
                    thrust_sum_ms * 1e3, wrong});

    const double avg_ms = median_ms(o, s, [&] { kc::average<float>(all, out.data(), n, s); });
    rows.push_back({n, "average k=" + std::to_string(o.k), avg_ms * 1e3, double(o.k + 1) * bytes, copy_gbs, 0, 0});

    const double scale_ms = median_ms(o, s, [&] { kc::scale<float>(out.data(), 0.999f, n, s); });
    const double thrust_scale_ms = median_ms(o, s, [&] {
      thrust::transform(thrust::cuda::par.on(s), thrust::device_pointer_cast(out.data()),
                        thrust::device_pointer_cast(out.data() + n), thrust::device_pointer_cast(out.data()),
                        thrust_scale{0.999f});
    });
    rows.push_back({n, "scale", scale_ms * 1e3, 2.0 * bytes, copy_gbs, thrust_scale_ms * 1e3, 0});

    const double axpy_ms = median_ms(o, s, [&] { kc::axpy<float>(1e-3f, grads[0].data(), out.data(), n, s); });
    rows.push_back({n, "axpy", axpy_ms * 1e3, 3.0 * bytes, copy_gbs, 0, 0});

    // Adam: the averaged gradient of one buffer (the all-reduce case: grad_scale = 1/N)
    // and of k buffers (replicas on one device); one step checked against float64.
    const auto c = gradwire::kernels::adam_coefficients<float>::make(1e-3, 0.9, 0.999, 1e-8, 0.0, false, 1, 0.25f);
    const double adam_ms = median_ms(o, s, [&] { kc::adam_step<float>(p.data(), one, m.data(), v.data(), n, c, s); });
    const thrust_adam ta{c.beta1, c.beta2, c.eps, c.step_size, c.inv_sqrt_bc2};
    const double thrust_adam_ms = median_ms(o, s, [&] {
      auto first = thrust::make_zip_iterator(thrust::make_tuple(
          thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(grads[0].data()),
          thrust::device_pointer_cast(m.data()), thrust::device_pointer_cast(v.data())));
      thrust::for_each(thrust::cuda::par.on(s), first, first + static_cast<std::ptrdiff_t>(n), ta);
    });
    wrong = 0;
    {
      // Fresh state, one step, compared with the update computed in double.
      for (auto* b : {&p, &m, &v}) gc::check(cudaMemsetAsync(b->data(), 0, bytes, s), "memset");
      kc::adam_step<float>(p.data(), one, m.data(), v.data(), n, c, s);
      const auto got = download(p.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        const double g = 0.25 * host_grads[0][i], mm = 0.1 * g, vv = 0.001 * g * g;
        const double want = -1e-3 / 0.1 * mm / (std::sqrt(vv / 0.001) + 1e-8);
        if (!(std::abs(got[i] - want) <= 1e-5 * std::abs(want) + 1e-12)) ++wrong;
      }
    }
    rows.push_back({n, "average+adam k=1", adam_ms * 1e3, 7.0 * bytes, copy_gbs, thrust_adam_ms * 1e3, wrong});
    const double adam_k_ms = median_ms(o, s, [&] { kc::adam_step<float>(p.data(), all, m.data(), v.data(), n, c, s); });
    rows.push_back({n, "average+adam k=" + std::to_string(o.k), adam_k_ms * 1e3, double(o.k + 6) * bytes, copy_gbs, 0, 0});

    const double sgd_ms = median_ms(o, s, [&] { kc::sgd_step<float>(p.data(), one, n, 0.01, 0.0, 0.25f, s); });
    rows.push_back({n, "average+sgd k=1", sgd_ms * 1e3, 3.0 * bytes, copy_gbs, 0, 0});
    const double mom_ms =
        median_ms(o, s, [&] { kc::momentum_step<float>(p.data(), one, m.data(), n, 0.01, 0.9, 0.0, false, 0.25f, s); });
    rows.push_back({n, "average+momentum k=1", mom_ms * 1e3, 5.0 * bytes, copy_gbs, 0, 0});

    // fp32 -> bf16 -> fp32 (compressed transfer) and the CUB norm
    gc::device_buffer<__nv_bfloat16> narrow(s);
    narrow.reserve_discard(n);
    const double to_bf16_ms =
        median_ms(o, s, [&] { kc::convert<float, __nv_bfloat16>(grads[0].data(), narrow.data(), n, s); });
    rows.push_back({n, "convert f32->bf16", to_bf16_ms * 1e3, 6.0 * n, copy_gbs, 0, 0});
    gc::device_buffer<std::byte> scratch(s);
    gc::device_buffer<double> norm(s);
    norm.reserve_discard(1);
    const double norm_ms = median_ms(o, s, [&] { kc::squared_norm<float>(grads[0].data(), n, norm.data(), scratch, s); });
    rows.push_back({n, "squared_norm (CUB)", norm_ms * 1e3, 1.0 * bytes, copy_gbs, 0, 0});

    for (const auto& r : rows) {
      const double gbs = r.bytes / (r.us * 1e3);
      const double x = r.thrust_us > 0 ? r.thrust_us / r.us : 0;
      std::printf("  %12zu %-24s %10.1f %12.0f %8.1f %6.1f%% %10s %8s %6zu\n", r.n, r.kernel.c_str(), r.us, r.bytes, gbs,
                  100.0 * gbs / r.copy_gbs, r.thrust_us > 0 ? std::to_string(r.thrust_us).substr(0, 8).c_str() : "-",
                  r.thrust_us > 0 ? std::to_string(x).substr(0, 5).c_str() : "-", r.wrong);
      if (csv)
        std::fprintf(csv, "%s,%zu,%s,%.3f,%.0f,%.3f,%.4f,%.3f,%zu\n", prop.name, r.n, r.kernel.c_str(), r.us, r.bytes, gbs,
                     gbs / r.copy_gbs, r.thrust_us, r.wrong);
      if (r.wrong) status = 1;
    }
  }
  if (csv) std::fclose(csv);
  return status;
}
