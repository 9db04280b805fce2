// Strategies with CUDA tensors train like the same strategies with host tensors (continued
// from test_cuda_strategy.cu): all-reduce over a staged transport, local_sgd, central_storage
// parameter_server<sync> and sharded (ZeRO-1, a device state per shard); and local_sgd's refusal of
// average_optimizer_state().
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_strategy_support.cuh"

using namespace gradwire::test::cuda_strategy;

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

template <class Tensor, class O>
using zero1 = gw::sharded<Tensor, O>;

// Each replica keeps device state for its shard alone and steps that slice on the device;
// the host run (test_sharded: bit-identical to the ring all-reduce) is the reference.
TEST_CASE("sharded (ZeRO-1) with CUDA tensors trains like with host tensors", "[cuda][strategy]") {
  const int ranks = GENERATE(2, 3, 4);
  CAPTURE(ranks);
  compare_two_ranks_or_more<zero1, float>(ranks, gw::optim::adamw({.lr = 0.02, .weight_decay = 0.01}));
  compare_two_ranks_or_more<zero1, float>(ranks, gw::optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true}));
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
    REQUIRE(what.find("(local SGD's average_optimizer_state(), elastic_all_reduce's joins), which CUDA tensors do not support yet") != std::string::npos);
  }
  // Off (the default), the same strategy builds and steps.
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    cuda_kind<float> kind(t.rank());
    S s(t, start_params(kind, t.rank()), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}));
    REQUIRE(s.parameters().size() == 2);
  });
}
