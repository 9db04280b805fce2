// One rank of a multi-process job whose replicas hold CUDA tensors, over loopback TCP erased
// behind transport::any_transport (cuda_join.cpp builds it: nvcc cannot compile Boost.Asio).
//
//   mp_cuda_worker probe                         exit 77 without a CUDA device (test_cuda_multiprocess.py)
//   mp_cuda_worker mirrored-adam | mirrored-momentum | central-adam | local-sgd | ps-sync
//
// Every rank computes the reference itself: one_device over host tensors, stepping with the
// mean gradient of all workers' batches (what synchronous data parallelism computes), from
// the starting values of the rank that setup broadcasts from. Ranks start from different
// values, so setup must make them equal. After every step the rank's parameters (read back from the device) must match
// the reference; the rank prints "rank R: PASS ..." and exits 0, or "FAIL ..." and exits 1.
#include <gradwire/cuda.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "multiprocess/cuda_join.hpp"
#include "helpers/least_squares.hpp"

namespace gw = gradwire;
using gw::testing::batch_data;

// Across processes nothing is shared: the device all-reduce must take its staged path
// (pinned chunks), with the host ring adding as it receives.
static_assert(!gw::concepts::shared_address_space_transport<gw::transport::any_transport>);
static_assert(gw::concepts::accumulating_transport<gw::transport::any_transport, float>);

namespace {

int my_rank = -1;
const gw::testing::least_squares model{7, 3, 5};  // W: 3 x 7 (21 floats: not a multiple of 4), b: 3
constexpr int steps = 6;

[[noreturn]] void fail(const std::string& what) {
  std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

std::vector<float> start_values(int rank, std::size_t n, int salt) {
  std::mt19937 gen(static_cast<unsigned>(1000 * salt + rank));
  std::normal_distribution<double> dist(0.0, 0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

// [step][worker] batches, the same on every rank.
std::vector<std::vector<batch_data>> training_data(int workers) {
  std::mt19937 gen(2026);
  std::vector<std::vector<batch_data>> data(steps);
  for (auto& step : data)
    for (int w = 0; w < workers; ++w) step.push_back(model.random_batch(gen));
  return data;
}

std::vector<float> flat(std::span<const std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// one_device over host tensors from `source`'s starting values (the rank whose values the
// strategy's setup hands to all), with the mean gradient of every worker's batch.
template <class Optimizer>
std::vector<std::vector<float>> reference(const Optimizer& opt, const std::vector<std::vector<batch_data>>& data,
                                          int source) {
  std::vector<gw::host_tensor<float>> p;
  for (int part = 0; part < 2; ++part) {
    const auto v = start_values(source, part == 0 ? model.outputs * model.inputs : model.outputs, part + 1);
    p.emplace_back(gw::shape{v.size()});
    std::copy(v.begin(), v.end(), p.back().data());
  }
  gw::one_device<gw::host_tensor<float>, Optimizer> s(std::move(p), opt);
  std::vector<std::vector<float>> history;
  for (const auto& step : data) {
    const auto q = s.parameters();
    std::vector<std::vector<double>> mean{std::vector<double>(q[0].size()), std::vector<double>(q[1].size())};
    const std::vector<double> w(q[0].data(), q[0].data() + q[0].size()), bias(q[1].data(), q[1].data() + q[1].size());
    for (const auto& b : step) {
      const auto g = model.gradients<double>(w.data(), bias.data(), b);
      for (int t = 0; t < 2; ++t)
        for (std::size_t i = 0; i < g[t].size(); ++i) mean[t][i] += g[t][i] / double(step.size());
    }
    std::vector<gw::host_tensor<float>> grads;
    for (const auto& m : mean) {
      grads.emplace_back(gw::shape{m.size()});
      std::transform(m.begin(), m.end(), grads.back().data(), [](double x) { return static_cast<float>(x); });
    }
    s.step(grads);
    const auto r = s.parameters();
    std::vector<std::vector<float>> parts{{r[0].data(), r[0].data() + r[0].size()}, {r[1].data(), r[1].data() + r[1].size()}};
    history.push_back(flat(parts));
  }
  return history;
}

std::vector<float> read(const gw::cuda_tensor<float>& t) {
  std::vector<float> v(t.size());
  t.copy_to_host(v);
  return v;
}

// Every parameter within 1e-5 of the reference, relative to itself plus the step's largest value.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int step) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(double(w)));
  if (got.size() != want.size()) fail("step " + std::to_string(step) + ": parameter count differs");
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (!(d <= 1e-5 * std::abs(double(want[i])) + 1e-5 * scale))
      fail("step " + std::to_string(step) + ", parameter " + std::to_string(i) + ": " + std::to_string(got[i]) +
           " on the device, " + std::to_string(want[i]) + " in the reference (difference " + std::to_string(d) + ")");
  }
}

template <class Optimizer, class Aggregation>
void train(const std::string& name, const Optimizer& opt, Aggregation aggregation, gw::test::joined_job job,
           int source = 0) {
  using S = gw::strategy<gw::cuda_tensor<float>, Optimizer, Aggregation, gw::transport::any_transport>;
  const int me = job.transport.rank(), workers = job.transport.size() - job.servers;
  const auto data = training_data(workers);
  const auto want = reference(opt, data, source);

  gw::cuda::stream stream;  // this rank's tensors, copies and kernels
  std::vector<gw::cuda_tensor<float>> params;
  params.emplace_back(gw::shape{model.outputs * model.inputs}, start_values(me, model.outputs * model.inputs, 1), stream);
  params.emplace_back(gw::shape{model.outputs}, start_values(me, model.outputs, 2), stream);
  S s(std::move(job.transport), std::move(params), opt, std::move(aggregation));
  if constexpr (requires { s.serve(); })
    if (s.is_server()) {
      s.serve();
      std::printf("rank %d: PASS %s (server)\n", me, name.c_str());
      return;
    }
  for (int k = 0; k < steps; ++k) {
    const auto w = read(s.parameters()[0]), b = read(s.parameters()[1]);
    std::vector<gw::cuda_tensor<float>> grads;
    for (const auto& g : model.gradients<float>(w.data(), b.data(), data[k][me]))
      grads.emplace_back(gw::shape{g.size()}, std::span<const float>(g), stream);
    s.step(grads);
    const std::vector<std::vector<float>> now{read(s.parameters()[0]), read(s.parameters()[1])};
    expect_close(flat(now), want[k], k);
  }
  std::printf("rank %d: PASS %s (%d steps against the host reference)\n", me, name.c_str(), steps);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "probe") {  // does this machine have a GPU for the test to run on?
      const int devices = gw::cuda::device_count();
      std::printf("%d CUDA device(s)\n", devices);
      return devices > 0 ? 0 : 77;
    }
    auto job = gw::test::join_tcp_erased();
    my_rank = job.transport.rank();
    if (mode == "mirrored-adam")
      train(mode, gw::optim::adam({.lr = 0.02}), gw::aggregation::all_reduce(), std::move(job));
    else if (mode == "mirrored-momentum")
      train(mode, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), gw::aggregation::all_reduce(), std::move(job));
    else if (mode == "central-adam") {
      const int owner = job.transport.size() - 1;
      train(mode, gw::optim::adam({.lr = 0.02}), gw::aggregation::central(owner), std::move(job), owner);
    } else if (mode == "local-sgd")  // H = 1 with plain SGD is synchronous SGD
      train(mode, gw::optim::sgd({.lr = 0.1}), gw::aggregation::averaging<1>(), std::move(job));
    else if (mode == "ps-sync") {
      gw::ps::options o;
      o.servers = job.servers;
      o.timeout = std::chrono::seconds(60);
      train(mode, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), gw::aggregation::parameter_server<gw::ps::sync>(o),
            std::move(job));
    } else {
      std::fprintf(stderr, "usage: mp_cuda_worker probe|mirrored-adam|mirrored-momentum|central-adam|local-sgd|ps-sync\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    return 1;
  }
  return 0;
}
