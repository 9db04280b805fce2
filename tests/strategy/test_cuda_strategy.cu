// Strategies with CUDA tensors train like the same strategies with host tensors: one_device,
// mirrored, local_sgd, central_storage and parameter_server<sync>, with SGD, momentum and Adam,
// each replica on its own stream; the host run is the reference, step by step. And what CUDA tensors refuse.
#include <gradwire/cuda.cuh>

#include <cmath>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "collective/collective_support.hpp"
#include "support/least_squares.hpp"
#include "support/reference.hpp"

using gradwire::test::require_trajectories_close;

namespace {

namespace gw = gradwire;
using gw::testing::batch_data;

const gw::testing::least_squares model{7, 3, 5};  // W: 3 x 7 (21 floats: odd, not a multiple of 4), b: 3

template <class T>
std::vector<T> start_values(int rank, std::size_t n, int salt) {
  std::mt19937 gen(static_cast<unsigned>(1000 * salt + rank));  // differs per rank: setup must make them equal
  std::normal_distribution<double> dist(0.0, 0.5);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// The two tensor kinds behind one interface: make tensors from host values, read them back.
template <class T>
struct host_kind {
  using tensor = gw::host_tensor<T>;
  explicit host_kind(int) {}
  tensor make(std::span<const T> values) {
    tensor t(gw::shape{values.size()});
    std::copy(values.begin(), values.end(), t.data());
    return t;
  }
  std::vector<T> read(const tensor& t) { return {t.data(), t.data() + t.size()}; }
};

template <class T>
struct cuda_kind {
  using tensor = gw::cuda_tensor<T>;
  gw::cuda::stream stream;  // this replica's stream: its tensors, copies and kernels go there
  explicit cuda_kind(int) {}
  tensor make(std::span<const T> values) { return tensor(gw::shape{values.size()}, values, stream); }
  std::vector<T> read(const tensor& t) {
    std::vector<T> v(t.size());
    t.copy_to_host(v);
    return v;
  }
};

template <class Kind>
std::vector<typename Kind::tensor> start_params(Kind& kind, int rank) {
  using T = typename Kind::tensor::value_type;
  std::vector<typename Kind::tensor> p;
  p.push_back(kind.make(start_values<T>(rank, model.outputs * model.inputs, 1)));
  p.push_back(kind.make(start_values<T>(rank, model.outputs, 2)));
  return p;
}

// Runs `steps` steps of strategy S on `ranks` in-process replicas (the last `servers` of
// them serve); returns the chief's flat parameters after every step.
template <template <class> class Kind, class T, class S, class MakeStrategy>
std::vector<std::vector<T>> train(int ranks, const std::vector<std::vector<batch_data>>& data, MakeStrategy make) {
  std::vector<std::vector<T>> history(data.size());
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    Kind<T> kind(me);
    S s = make(t, start_params(kind, me));
    if constexpr (requires { s.serve(); }) {
      if (s.is_server()) {
        s.serve();
        return;
      }
    }
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      const std::vector<T> w = kind.read(p[0]), b = kind.read(p[1]);
      const auto g = model.gradients<T>(w.data(), b.data(), data[k][static_cast<std::size_t>(me)]);
      std::vector<typename Kind<T>::tensor> grads;
      for (const auto& gi : g) grads.push_back(kind.make(gi));
      s.step(grads);
      if (me == 0) {
        std::vector<T> flat = kind.read(s.parameters()[0]);
        const auto bias = kind.read(s.parameters()[1]);
        flat.insert(flat.end(), bias.begin(), bias.end());
        history[k] = flat;
      }
    }
  });
  return history;
}

std::vector<std::vector<batch_data>> training_data(int replicas, int steps) {
  std::mt19937 gen(std::random_device{}());
  std::vector<std::vector<batch_data>> data(static_cast<std::size_t>(steps));
  for (auto& step : data)
    for (int r = 0; r < replicas; ++r) step.push_back(model.random_batch(gen));
  return data;
}

// The same strategy over host tensors and over CUDA tensors, compared step by step.
template <template <class, class> class Strategy, class T, class O>
void compare_two_ranks_or_more(int ranks, O opt) {
  const auto data = training_data(ranks, 6);
  auto make = [&](auto& t, auto params) {
    using Tensor = typename decltype(params)::value_type;
    return Strategy<Tensor, O>(t, std::move(params), opt);
  };
  const auto host = train<host_kind, T, Strategy<gw::host_tensor<T>, O>>(ranks, data, make);
  const auto device = train<cuda_kind, T, Strategy<gw::cuda_tensor<T>, O>>(ranks, data, make);
  require_trajectories_close(device, host);
}

template <class Tensor, class O>
using local_sgd_2 = gw::local_sgd<Tensor, O, 2>;
template <class Tensor, class O>
using central = gw::central_storage<Tensor, O>;

}  // namespace

TEST_CASE("one_device with a CUDA tensor trains like with a host tensor", "[cuda][strategy]") {
  const auto data = training_data(1, 8);
  auto run = [&](auto kind_tag, auto opt) {
    using Kind = decltype(kind_tag);
    using S = gw::one_device<typename Kind::tensor, decltype(opt)>;
    std::vector<std::vector<float>> history;
    Kind kind(0);
    S s(start_params(kind, 0), opt);
    for (const auto& step : data) {
      const auto w = kind.read(s.parameters()[0]), b = kind.read(s.parameters()[1]);
      std::vector<typename Kind::tensor> grads;
      for (const auto& g : model.gradients<float>(w.data(), b.data(), step[0])) grads.push_back(kind.make(g));
      s.step(grads);
      auto flat = kind.read(s.parameters()[0]);
      const auto bias = kind.read(s.parameters()[1]);
      flat.insert(flat.end(), bias.begin(), bias.end());
      history.push_back(flat);
    }
    return history;
  };
  require_trajectories_close(run(cuda_kind<float>(0), gw::optim::adam({.lr = 0.05})),
                run(host_kind<float>(0), gw::optim::adam({.lr = 0.05})));
  require_trajectories_close(run(cuda_kind<float>(0), gw::optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true})),
                run(host_kind<float>(0), gw::optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true})));
}

TEST_CASE("mirrored with CUDA tensors (replicas on their own streams) trains like with host tensors",
          "[cuda][strategy]") {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  compare_two_ranks_or_more<gw::mirrored, float>(ranks, gw::optim::sgd({.lr = 0.1, .weight_decay = 0.01}));
  compare_two_ranks_or_more<gw::mirrored, float>(ranks, gw::optim::adamw({.lr = 0.02}));
  compare_two_ranks_or_more<gw::mirrored, double>(ranks, gw::optim::momentum({.lr = 0.05, .momentum = 0.8}));
}

TEST_CASE("all-reduce with CUDA tensors over a transport without a shared address space (staged) trains like "
          "with host tensors", "[cuda][strategy]") {
  const auto data = training_data(3, 6);
  const auto opt = gw::optim::adam({.lr = 0.02});
  auto make = [&](auto& t, auto params) {
    using Tensor = typename decltype(params)::value_type;
    return gw::strategy<Tensor, gw::optim::adam, gw::aggregation::all_reduce, gw::test::staging_only>(
        gw::test::staging_only{t}, std::move(params), opt);
  };
  using host_s = gw::strategy<gw::host_tensor<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::test::staging_only>;
  using cuda_s = gw::strategy<gw::cuda_tensor<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::test::staging_only>;
  require_trajectories_close(train<cuda_kind, float, cuda_s>(3, data, make), train<host_kind, float, host_s>(3, data, make));
}

TEST_CASE("local_sgd<H = 2> and central_storage with CUDA tensors train like with host tensors", "[cuda][strategy]") {
  compare_two_ranks_or_more<local_sgd_2, float>(3, gw::optim::sgd({.lr = 0.1}));
  compare_two_ranks_or_more<central, float>(2, gw::optim::adam({.lr = 0.02}));
}

TEST_CASE("parameter_server<sync> with CUDA tensors on workers and server trains like with host tensors",
          "[cuda][strategy]") {
  constexpr int workers = 2, servers = 1;
  const auto data = training_data(workers, 6);
  gw::ps::options o;
  o.servers = servers;
  o.timeout = std::chrono::seconds(60);
  auto make = [&](auto& t, auto params) {
    using Tensor = typename decltype(params)::value_type;
    using S = gw::parameter_server<Tensor, gw::optim::momentum, gw::ps::sync>;
    return S(t, std::move(params), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), typename S::aggregation_type(o));
  };
  using host_s = gw::parameter_server<gw::host_tensor<float>, gw::optim::momentum, gw::ps::sync>;
  using cuda_s = gw::parameter_server<gw::cuda_tensor<float>, gw::optim::momentum, gw::ps::sync>;
  const auto host = train<host_kind, float, host_s>(workers + servers, data, make);
  const auto device = train<cuda_kind, float, cuda_s>(workers + servers, data, make);
  require_trajectories_close(device, host);
}

TEST_CASE("a CUDA strategy refuses gradients of the wrong size with a clear error", "[cuda][strategy]") {
  cuda_kind<float> kind(0);
  gw::one_device<gw::cuda_tensor<float>, gw::optim::sgd> s(start_params(kind, 0));
  std::vector<gw::cuda_tensor<float>> grads;
  grads.push_back(kind.make(std::vector<float>(model.outputs * model.inputs + 1, 1.0f)));
  grads.push_back(kind.make(std::vector<float>(model.outputs, 1.0f)));
  REQUIRE_THROWS_MATCHES(s.step(grads), gw::error,
                         gw::test::error_matcher(gw::errc::invalid_argument, {"gradient 0 has 22 elements"}));
}

TEST_CASE("local_sgd with CUDA tensors refuses average_optimizer_state() on every rank, naming why", "[cuda][strategy]") {
  // The check runs in the constructor, before any collective: each rank refuses on its own,
  // so no rank waits on a peer that threw.
  using S = gw::local_sgd<gw::cuda_tensor<float>, gw::optim::momentum, 2>;
  std::mutex m;
  std::vector<std::pair<gw::errc, std::string>> refusals;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    cuda_kind<float> kind(t.rank());
    try {
      S s(t, start_params(kind, t.rank()), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}),
          S::aggregation_type().average_optimizer_state());
    } catch (const gw::error& e) {
      std::lock_guard lock(m);
      refusals.emplace_back(e.kind(), e.what());
      return;
    }
  });
  REQUIRE(refusals.size() == 2);
  for (const auto& [kind, what] : refusals) {
    CAPTURE(what);
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE(what.find("average_optimizer_state() is not available for CUDA tensors") != std::string::npos);
  }
  // Off (the default), the same strategy builds and steps.
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    cuda_kind<float> kind(t.rank());
    S s(t, start_params(kind, t.rank()), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}));
    REQUIRE(s.parameters().size() == 2);
  });
}
