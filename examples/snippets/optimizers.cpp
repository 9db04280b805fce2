// docs/optimizers.md's code: PyTorch optimizers written as gradwire's, an lr schedule through set_lr,
// and an optimizer chosen at run time (optim::one_of).
//
// The region's #include repeats the one below: under #pragma once it adds nothing, and the
// page shows which header to include.
#include <gradwire/gradwire.hpp>

#include <cmath>
#include <cstddef>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snippet_support.hpp"

using snippets::Model;

int main() {
  const unsigned seed = std::random_device{}();
  namespace gw = gradwire;

  {
    // [docs:from_pytorch]
    #include <gradwire/gradwire.hpp>
    namespace gw = gradwire;

    // torch.optim.SGD(params, lr=0.1, weight_decay=1e-4)
    gw::optim::sgd sgd({.lr = 0.1, .weight_decay = 1e-4});
    // torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    gw::optim::momentum nesterov({.lr = 0.05, .momentum = 0.9, .nesterov = true});
    // torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)
    gw::optim::adam adam({.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0});
    // torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    gw::optim::adamw adamw({.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2});
    // [/docs:from_pytorch]

    // What the page says of the defaults: Adam's and AdamW's are PyTorch's.
    const auto a = gw::optim::adam{}.settings(), b = adam.settings();
    snippets::expect("adam's defaults are PyTorch's",
                     a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
                         a.weight_decay == b.weight_decay);
    const auto c = gw::optim::adamw{}.settings(), d = adamw.settings();
    snippets::expect("adamw's defaults are PyTorch's",
                     c.lr == d.lr && c.beta1 == d.beta1 && c.beta2 == d.beta2 && c.eps == d.eps &&
                         c.weight_decay == d.weight_decay);
    snippets::expect("momentum's options are as written", nesterov.settings().nesterov && sgd.settings().lr == 0.1);
  }

  // A schedule: one device, momentum, cosine decay set before every step, against float64.
  const auto data = snippets::make_batches(Model::shape, 12, 8, seed);
  Model model(seed);
  gw::one_device<gw::tensor_view<float>, gw::optim::momentum> strategy(
      model.parameter_views(), gw::optim::momentum({.lr = 0.1, .momentum = 0.9}));
  const double lr = 0.1;
  const std::size_t steps = data.size();
  // [docs:schedule]
  for (std::size_t step = 0; step < steps; ++step) {
    // Cosine decay, as torch.optim.lr_scheduler.CosineAnnealingLR(T_max=steps) would set it.
    strategy.optimizer().set_lr(lr * 0.5 * (1.0 + std::cos(std::numbers::pi * double(step) / double(steps))));
    model.forward_backward(data[step]);
    strategy.step(model.gradient_views());
  }
  // [/docs:schedule]

  std::vector<double> want = Model::initial_values(seed);
  snippets::reference_momentum reference(lr, 0.9);
  for (std::size_t step = 0; step < steps; ++step) {
    reference.lr = lr * 0.5 * (1.0 + std::cos(std::numbers::pi * double(step) / double(steps)));
    reference.step(want, snippets::gradient(Model::shape, std::span<const double>(want), data[step]));
  }
  snippets::expect_close("momentum with a cosine schedule through set_lr, against float64",
                         std::span<const float>(model.values()), std::span<const double>(want), 1e-5);

  // The optimizer a flag names, chosen at run time: the same training, bit for bit.
  const std::string flag = "momentum";
  Model chosen_model(seed);
  // [docs:chosen_at_run_time]
  using any_optimizer = gw::optim::one_of<gw::optim::sgd, gw::optim::momentum, gw::optim::adam>;
  auto optimizer_named = [](std::string_view name) -> any_optimizer {
    if (name == "sgd") return gw::optim::sgd({.lr = 0.1});
    if (name == "momentum") return gw::optim::momentum({.lr = 0.1, .momentum = 0.9});
    return gw::optim::adam({.lr = 1e-3});
  };
  // One strategy type, compiled once, whichever optimizer the flag names.
  gw::one_device<gw::tensor_view<float>, any_optimizer> chosen(chosen_model.parameter_views(), optimizer_named(flag));
  // [/docs:chosen_at_run_time]
  for (std::size_t step = 0; step < steps; ++step) {
    chosen.optimizer().set_lr(lr * 0.5 * (1.0 + std::cos(std::numbers::pi * double(step) / double(steps))));
    chosen_model.forward_backward(data[step]);
    chosen.step(chosen_model.gradient_views());
  }
  snippets::expect("one_of holding momentum is named after it", chosen.optimizer().name() == "momentum");
  snippets::expect("one_of holding momentum trains bit for bit as momentum", chosen_model.values() == model.values());
  return snippets::report("snippet optimizers", seed);
}
