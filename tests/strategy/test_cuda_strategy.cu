// Strategies with CUDA tensors train like the same strategies with host tensors, with SGD,
// momentum, Adam and AdamW, each replica on its own stream; the host run is the reference,
// step by step: one_device and mirrored here, and a wrong gradient size refused
// (test_cuda_strategy_more.cu: the other strategies; two translation units, for compile time).
#include "cuda_strategy_support.cuh"

using namespace gradwire::test::cuda_strategy;

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

TEST_CASE("a CUDA strategy refuses gradients of the wrong size with a clear error", "[cuda][strategy]") {
  cuda_kind<float> kind(0);
  gw::one_device<gw::cuda_tensor<float>, gw::optim::sgd> s(start_params(kind, 0));
  std::vector<gw::cuda_tensor<float>> grads;
  grads.push_back(kind.make(std::vector<float>(model.outputs * model.inputs + 1, 1.0f)));
  grads.push_back(kind.make(std::vector<float>(model.outputs, 1.0f)));
  REQUIRE_THROWS_MATCHES(s.step(grads), gw::error,
                         gw::test::error_matcher(gw::errc::invalid_argument, {"gradient 0 has 22 elements"}));
}
