// examples/libtorch's bridge: N replicas of a torch::nn model, each with batch b and its gradients handed over
// from autograd hooks (begin_step / ready / finish), end K steps where LibTorch alone (torch::optim::SGD, one
// process, batch N*b) ends, within 1e-5 per tensor; over inproc threads with all-reduce and a synchronous
// parameter server, and (hidden test cases, run by ctest under scripts/gradwire-run) over asio_tcp processes.
#include <catch2/catch.hpp>
// LibTorch's headers bring glog, whose CHECK replaces Catch's: this file uses REQUIRE only.

#include <gradwire/gradwire.hpp>
#if GRADWIRE_HAS_ASIO
#include <gradwire/asio.hpp>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "torch_bridge.hpp"
#include "helpers/reference.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

namespace gw = gradwire;

namespace {

constexpr std::int64_t inputs = 12, classes = 3;
constexpr double lr = 0.2;
constexpr double tolerance = 1e-5;  // |p - reference| / |reference|, per tensor

// Two hidden layers, and a layer the forward pass never uses: its gradient never comes,
// so the bridge marks it unused (a zero gradient), and it must stay as it started.
struct net_impl : torch::nn::Module {
  net_impl()
      : fc1(register_module("fc1", torch::nn::Linear(inputs, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 8))),
        idle(register_module("idle", torch::nn::Linear(4, 2))),
        fc3(register_module("fc3", torch::nn::Linear(8, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::tanh(fc2->forward(torch::tanh(fc1->forward(x)))));
  }
  torch::nn::Linear fc1, fc2, idle, fc3;
};
TORCH_MODULE_IMPL(net, net_impl);

// Built on the calling thread: torch's default generator is process-wide, so models made
// on rank threads would draw their weights in whatever order the threads run.
net make_net(std::uint64_t seed) {
  torch::manual_seed(seed);
  return net();
}

// Every step's global batch (steps x (ranks * b) rows), from std::mt19937_64, not torch's generator.
struct data_set {
  std::vector<torch::Tensor> x, y;
  data_set(std::uint64_t seed, int steps, std::int64_t rows) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<std::int64_t> label(0, classes - 1);
    for (int k = 0; k < steps; ++k) {
      auto xs = torch::empty({rows, inputs});
      auto ys = torch::empty({rows}, torch::kLong);
      for (std::int64_t i = 0; i < xs.numel(); ++i) xs.data_ptr<float>()[i] = normal(gen);
      for (std::int64_t i = 0; i < rows; ++i) ys.data_ptr<std::int64_t>()[i] = label(gen);
      x.push_back(xs);
      y.push_back(ys);
    }
  }
};

torch::Tensor loss_of(net& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

// LibTorch alone: plain SGD on the whole global batch, from rank 0's initial model.
std::vector<torch::Tensor> reference(std::uint64_t seed, const data_set& data) {
  net model = make_net(seed);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr));
  for (std::size_t k = 0; k < data.x.size(); ++k) {
    sgd.zero_grad();
    loss_of(model, data.x[k], data.y[k]).backward();
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// A step handle wrapped to see what the hooks hand over: each gradient as ready() sees
// it (copied at that moment), the order, and whether backward was still running.
template <class Step>
struct recording_step {
  Step& step;
  std::vector<torch::Tensor> at_ready;  // per parameter; undefined if unused
  std::vector<std::size_t> order;
  std::vector<std::size_t> marked_unused;
  const bool* backward_returned;
  bool ready_after_backward = false;

  void ready(std::size_t i, const gw::tensor_view<float>& g) {
    if (*backward_returned) ready_after_backward = true;
    at_ready[i] = torch::from_blob(g.data(), {static_cast<std::int64_t>(g.size())}, torch::kFloat).clone();
    order.push_back(i);
    step.ready(i, g);
  }
  void unused(std::size_t i) {
    marked_unused.push_back(i);
    step.unused(i);
  }
};

struct rank_result {
  std::vector<torch::Tensor> parameters;
  std::string hook_problems;  // empty when every hook behaved
};

// One replica's K steps: its shard of each global batch, gradients from the hooks. On step 0
// it checks what the hooks handed over against .grad after backward (the final gradient),
// and that each handed-over view is the .grad memory, still there after zero_grad.
template <class Strategy>
rank_result train_replica(Strategy& strategy, net& model, torch_bridge::module_bridge& bridge, const data_set& data,
                          int worker, std::int64_t batch) {
  rank_result out;
  const auto grads_before = bridge.gradient_views();
  for (std::size_t k = 0; k < data.x.size(); ++k) {
    const auto x = data.x[k].narrow(0, worker * batch, batch), y = data.y[k].narrow(0, worker * batch, batch);
    auto step = strategy.begin_step();
    const auto loss = loss_of(model, x, y);
    if (k == 0) {
      bool returned = false;
      recording_step<decltype(step)> seen{step, std::vector<torch::Tensor>(bridge.size()), {}, {}, &returned};
      bridge.backward(loss, seen);
      returned = true;
      std::string& problems = out.hook_problems;
      if (seen.ready_after_backward) problems += "ready() ran after backward returned; ";
      // Backward order: the last layer's gradients (fc3: 6, 7) come first, the first layer's (fc1: 0, 1) last.
      if (seen.order.size() != 6 || seen.order.front() < 6 || seen.order.back() > 1)
        problems += "the gradients were not handed over last layer first; ";
      if (seen.marked_unused != std::vector<std::size_t>{4, 5}) problems += "idle's weight and bias were not marked unused; ";
      const auto params = model->parameters();
      for (std::size_t i = 0; i < bridge.size(); ++i) {
        if (!seen.at_ready[i].defined()) continue;
        const auto final_grad = params[i].grad().reshape({-1});
        if (!torch::equal(seen.at_ready[i], final_grad))
          problems += "parameter " + std::to_string(i) + "'s view did not hold its final gradient at ready(); ";
        if (params[i].grad().data_ptr<float>() != bridge.gradient_views()[i].data())
          problems += "parameter " + std::to_string(i) + "'s .grad is not the viewed memory; ";
      }
    } else {
      bridge.backward(loss, step);
    }
    step.finish();
    bridge.zero_grad();
  }
  const auto params = model->parameters();
  for (std::size_t i = 0; i < bridge.size(); ++i) {
    if (params[i].grad().data_ptr<float>() != grads_before[i].data())
      out.hook_problems += "parameter " + std::to_string(i) + "'s .grad moved; ";
    if (params[i].grad().abs().max().item<float>() != 0.0f)
      out.hook_problems += "parameter " + std::to_string(i) + "'s .grad is not zero after zero_grad; ";
    out.parameters.push_back(params[i].detach().clone());
  }
  return out;
}

// |p - ref| / |ref| per tensor, each below 1e-5; prints the largest.
void require_matches_reference(const std::string& who, const rank_result& got, const std::vector<torch::Tensor>& ref) {
  INFO(who);
  REQUIRE(got.parameters.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double diff = (got.parameters[i] - ref[i]).norm().item<double>();
    const double norm = ref[i].norm().item<double>();
    const double relative = diff / norm;
    worst = std::max(worst, relative);
    INFO("parameter " << i << ": |p - ref| / |ref| = " << relative);
    REQUIRE(relative <= tolerance);
  }
  WARN(who << ": largest |p - reference| / |reference| over the tensors " << worst);
  INFO("what the hooks did wrong: " << got.hook_problems);
  REQUIRE(got.hook_problems.empty());
}

// N replicas on threads: models and bridges built here, before the threads start.
template <class Make>
std::vector<rank_result> run_threads(int ranks, int servers, std::uint64_t seed, const data_set& data,
                                     std::int64_t batch, Make make_strategy) {
  std::vector<net> models;
  std::vector<torch_bridge::module_bridge> bridges;
  for (int r = 0; r < ranks + servers; ++r) {
    // Replicas other than 0 start elsewhere: the strategy's setup makes them equal.
    models.push_back(make_net(r == 0 ? seed : seed + 1000 + std::uint64_t(r)));
    bridges.emplace_back(*models.back());
  }
  std::vector<rank_result> results(ranks);
  gw::transport::run_inproc(ranks + servers, [&](gw::transport::inproc endpoint) {
    torch::set_num_threads(1);  // the replicas share the machine's cores
    const int me = endpoint.rank();
    auto strategy = make_strategy(std::move(endpoint), bridges[me].parameter_views());
    if constexpr (requires { strategy.serve(); })
      if (strategy.is_server()) {
        strategy.serve();
        return;
      }
    results[me] = train_replica(strategy, models[me], bridges[me], data, me, batch);
  });
  return results;
}

constexpr int steps = 8;
constexpr std::int64_t batch = 5;

}  // namespace

TEST_CASE("libtorch: N replicas with hooks, all-reduce over threads == LibTorch SGD with batch N*b") {
  const std::uint64_t seed = gw::test::fresh_seed();
  INFO("seed " << seed);
  for (int ranks : {2, 3}) {
    const data_set data(seed + 1, steps, ranks * batch);
    const auto ref = reference(seed, data);
    const auto got = run_threads(ranks, 0, seed, data, batch, [](gw::transport::inproc t, auto params) {
      return gw::mirrored<gw::tensor_view<float>, gw::optim::sgd>(std::move(t), std::move(params),
                                                                 gw::optim::sgd({.lr = lr}));
    });
    for (int r = 0; r < ranks; ++r)
      require_matches_reference(std::to_string(ranks) + " ranks, rank " + std::to_string(r), got[r], ref);
  }
}

TEST_CASE("libtorch: small buckets, so hooks start reductions while backward runs: still == LibTorch") {
  const std::uint64_t seed = gw::test::fresh_seed();
  INFO("seed " << seed);
  const data_set data(seed + 1, steps, 2 * batch);
  const auto ref = reference(seed, data);
  // 64-byte buckets: about one per tensor, each reduced as soon as its gradient is accumulated.
  const auto got = run_threads(2, 0, seed, data, batch, [](gw::transport::inproc t, auto params) {
    return gw::mirrored<gw::tensor_view<float>, gw::optim::sgd>(std::move(t), std::move(params),
                                                               gw::optim::sgd({.lr = lr}), gw::aggregation::all_reduce(64));
  });
  for (int r = 0; r < 2; ++r) require_matches_reference("rank " + std::to_string(r), got[r], ref);
}

TEST_CASE("libtorch: 2 workers with hooks, a synchronous parameter server on 2 server threads == LibTorch") {
  const std::uint64_t seed = gw::test::fresh_seed();
  INFO("seed " << seed);
  const data_set data(seed + 1, steps, 2 * batch);
  const auto ref = reference(seed, data);
  gw::ps::options ps;
  ps.servers = 2;
  ps.split_bytes = 64;  // fc1's weight is split over both servers
  ps.timeout = std::chrono::seconds(60);
  const auto got = run_threads(2, 2, seed, data, batch, [&](gw::transport::inproc t, auto params) {
    return gw::parameter_server<gw::tensor_view<float>, gw::optim::sgd, gw::ps::sync>(
        std::move(t), std::move(params), gw::optim::sgd({.lr = lr}), gw::aggregation::parameter_server<gw::ps::sync>(ps));
  });
  for (int r = 0; r < 2; ++r) require_matches_reference("worker " + std::to_string(r), got[r], ref);
}

TEST_CASE("libtorch: gradient accumulation, micro-batches through no_sync steps and hooks == LibTorch with batch N*K*b") {
  const std::uint64_t seed = gw::test::fresh_seed();
  INFO("seed " << seed);
  constexpr int ranks = 2, micro = 3;
  const data_set data(seed + 1, steps, ranks * micro * batch);
  const auto ref = reference(seed, data);
  std::vector<net> models;
  std::vector<torch_bridge::module_bridge> bridges;
  for (int r = 0; r < ranks; ++r) {
    models.push_back(make_net(r == 0 ? seed : seed + 1000 + std::uint64_t(r)));
    bridges.emplace_back(*models.back());
  }
  std::vector<rank_result> results(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    torch::set_num_threads(1);
    const int me = endpoint.rank();
    gw::mirrored<gw::tensor_view<float>, gw::optim::sgd> strategy(std::move(endpoint), bridges[me].parameter_views(),
                                                                 gw::optim::sgd({.lr = lr}));
    for (std::size_t k = 0; k < data.x.size(); ++k)
      for (int m = 0; m < micro; ++m) {
        // Each micro-batch's gradient goes to the strategy, which adds them up; .grad is zeroed between.
        const std::int64_t first = (me * micro + m) * batch;
        const auto x = data.x[k].narrow(0, first, batch), y = data.y[k].narrow(0, first, batch);
        auto& bridge = bridges[me];
        // [docs:no_sync]
        // `micro` micro-batches per step: all but the last only add up their gradients (no communication)
        auto step = m + 1 < micro ? strategy.begin_step(gw::no_sync) : strategy.begin_step();
        bridge.backward(loss_of(models[me], x, y), step);
        step.finish();        // a no_sync step: adds this micro-batch's gradients to the strategy's sum
        bridge.zero_grad();   // so .grad holds one micro-batch at a time
        // [/docs:no_sync]
      }
    for (const auto& p : models[me]->parameters()) results[me].parameters.push_back(p.detach().clone());
  });
  for (int r = 0; r < ranks; ++r) require_matches_reference("rank " + std::to_string(r), results[r], ref);
}

TEST_CASE("libtorch: the one-call step after backward, with .grad freed by zero_grad(set_to_none) between steps") {
  const std::uint64_t seed = gw::test::fresh_seed();
  INFO("seed " << seed);
  constexpr int ranks = 2;
  const data_set data(seed + 1, steps, ranks * batch);
  const auto ref = reference(seed, data);
  std::vector<net> models;
  std::vector<torch_bridge::module_bridge> bridges;
  for (int r = 0; r < ranks; ++r) {
    models.push_back(make_net(r == 0 ? seed : seed + 1000 + std::uint64_t(r)));
    bridges.emplace_back(*models.back());
  }
  std::vector<rank_result> results(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    torch::set_num_threads(1);
    const int me = endpoint.rank();
    auto& bridge = bridges[me];
    const auto views = bridge.gradient_views();
    gw::mirrored<gw::tensor_view<float>, gw::optim::sgd> strategy(std::move(endpoint), bridge.parameter_views(),
                                                                 gw::optim::sgd({.lr = lr}));
    for (std::size_t k = 0; k < data.x.size(); ++k) {
      // Newer LibTorch's default: .grad freed; the backward below puts it in fresh memory, which
      // the bridge's hooks (outside a step here) copy back into the memory the views see.
      models[me]->zero_grad(/*set_to_none=*/true);
      loss_of(models[me], data.x[k].narrow(0, me * batch, batch), data.y[k].narrow(0, me * batch, batch)).backward();
      strategy.step(views);
    }
    const auto params = models[me]->parameters();
    for (std::size_t i = 0; i < bridge.size(); ++i) {
      const auto& p = params[i];
      // idle (4, 5) never gets a gradient: its .grad stays freed, which the one-call step never reads.
      if (p.grad().defined() && p.grad().data_ptr<float>() != views[i].data())
        results[me].hook_problems += "parameter " + std::to_string(i) + "'s .grad is not the viewed memory; ";
      results[me].parameters.push_back(p.detach().clone());
    }
  });
  for (int r = 0; r < ranks; ++r) require_matches_reference("rank " + std::to_string(r), results[r], ref);
}

#if GRADWIRE_HAS_ASIO
// Processes over asio_tcp, started by ctest through scripts/gradwire-run (hidden from a
// plain run): every process trains its replica and compares it with its own LibTorch run.
namespace {
std::uint64_t job_seed() {  // the same in every process of a job, fresh per job
  if (const char* s = std::getenv("GRADWIRE_TEST_SEED"); s != nullptr && *s != '\0') return std::strtoull(s, nullptr, 0);
  const char* token = std::getenv("GRADWIRE_JOB_TOKEN");
  return std::hash<std::string>{}(token != nullptr ? token : "gradwire");
}
}  // namespace

TEST_CASE("libtorch: processes with hooks, multi_worker_mirrored over TCP == LibTorch", "[.processes]") {
  const std::uint64_t seed = job_seed();
  INFO("seed " << seed);
  const auto spec = gw::cluster::detect();
  const data_set data(seed + 1, steps, spec.world_size * batch);
  const auto ref = reference(seed, data);
  net model = make_net(spec.rank == 0 ? seed : seed + 1000 + std::uint64_t(spec.rank));
  torch_bridge::module_bridge bridge(*model);
  gw::multi_worker_mirrored<gw::tensor_view<float>, gw::optim::sgd> strategy(
      gw::cluster::join_tcp(), bridge.parameter_views(), gw::optim::sgd({.lr = lr}), gw::aggregation::all_reduce(256));
  const auto got = train_replica(strategy, model, bridge, data, strategy.rank(), batch);
  require_matches_reference("rank " + std::to_string(spec.rank), got, ref);
}

TEST_CASE("libtorch: worker processes with hooks, a synchronous parameter server over TCP == LibTorch",
          "[.processes_ps]") {
  const std::uint64_t seed = job_seed();
  INFO("seed " << seed);
  const auto spec = gw::cluster::detect();
  gw::ps::options ps;
  ps.servers = spec.count(gw::cluster::task_type::ps);
  REQUIRE(ps.servers >= 1);
  const int workers = spec.world_size - ps.servers;
  const data_set data(seed + 1, steps, workers * batch);
  const auto ref = reference(seed, data);
  net model = make_net(spec.rank == 0 ? seed : seed + 1000 + std::uint64_t(spec.rank));
  torch_bridge::module_bridge bridge(*model);
  gw::parameter_server<gw::tensor_view<float>, gw::optim::sgd, gw::ps::sync, gw::transport::asio_tcp> strategy(
      gw::cluster::join_tcp(), bridge.parameter_views(), gw::optim::sgd({.lr = lr}),
      gw::aggregation::parameter_server<gw::ps::sync>(ps));
  if (strategy.is_server()) {
    strategy.serve();
    return;
  }
  const auto got = train_replica(strategy, model, bridge, data, strategy.rank(), batch);
  require_matches_reference("worker " + std::to_string(spec.rank), got, ref);
}
#endif
