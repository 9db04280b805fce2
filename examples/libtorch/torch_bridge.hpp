// gradwire views over a LibTorch model's parameters and gradients, and autograd hooks that hand each gradient to a step the moment it is final.
//
// Memory: gradwire trains the model's own parameter memory (tensor_view over each
// parameter's data_ptr), and reads each gradient straight from the parameter's .grad. So
// the .grad tensors are allocated once, here, and zeroed in place each step (zero_grad()
// below): LibTorch then accumulates into them in place (AccumulateGrad does
// `grad += new_grad` when .grad exists and no double-backward graph is being built), and
// the views stay valid for the bridge's lifetime. Module::zero_grad(true), which newer
// LibTorch versions do by default, frees .grad; the next backward would put the gradient
// in fresh memory the views do not see (the hook notices and copies it back, at the cost
// of a copy).
//
// Hooks: a tensor hook (Tensor::register_hook) runs before the gradient is accumulated
// into .grad, with the incoming contribution only; handing .grad's memory to gradwire
// there would send last step's zeros. So, like PyTorch's DDP reducer, the bridge adds a
// post hook to each parameter's gradient accumulator (the AccumulateGrad node autograd
// runs for a leaf): it runs after the accumulation, when .grad holds the final gradient
// of this backward, and calls step.ready(i, view of .grad i), so the gradient travels
// while backward goes on computing the gradients of earlier layers. LibTorch 1.13 has no
// public hook for "after accumulation" (Tensor::register_post_accumulate_grad_hook came
// in 2.1); the accumulator's post hook is what it offers, through
// torch::autograd::impl::grad_accumulator. A parameter holds its accumulator only
// weakly (the graph of a forward pass holds it strongly), so the bridge keeps each one
// alive: otherwise the next forward would make a new accumulator without the hook.
#pragma once

// The autograd, tensor and module headers the bridge uses, not <torch/torch.h>: that one
// alone took 31 CPU s to parse, these 25 (docs/building.md).
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gradwire/error.hpp>
#include <gradwire/tensor/host_tensor.hpp>

namespace torch_bridge {

namespace detail {

inline gradwire::shape shape_of(const torch::Tensor& t) {
  std::vector<std::size_t> extents;
  for (const auto e : t.sizes()) extents.push_back(static_cast<std::size_t>(e));
  return gradwire::shape(extents);
}

inline gradwire::tensor_view<float> view_of(const torch::Tensor& t) {
  return gradwire::tensor_view<float>(t.data_ptr<float>(), shape_of(t));
}

// What the hooks share with the bridge; on the heap, so that a bridge can move.
struct hook_state {
  std::vector<torch::Tensor> parameters;
  std::vector<torch::Tensor> gradients;  // each parameter's .grad, allocated once
  std::vector<gradwire::tensor_view<float>> gradient_views;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: they carry the hooks
  std::vector<std::uintptr_t> hook_keys;
  std::vector<char> delivered;  // this backward pass, per parameter
  // Set by module_bridge::backward while a step takes gradients; empty otherwise.
  std::function<void(std::size_t, const gradwire::tensor_view<float>&)> sink;

  // Parameter i's gradient has been accumulated into its .grad.
  void accumulated(std::size_t i) {
    torch::Tensor& grad = parameters[i].mutable_grad();
    if (!grad.is_same(gradients[i])) {
      // Someone replaced .grad (zero_grad(set_to_none), a create_graph backward, an
      // assignment): bring the gradient back into the memory gradwire views.
      torch::NoGradGuard no_grad;
      if (grad.defined())
        gradients[i].copy_(grad);
      else
        gradients[i].zero_();
      grad = gradients[i];
    }
    if (!sink) return;  // a backward outside a step: the gradient stays in .grad
    if (delivered[i])
      throw gradwire::error(gradwire::errc::invalid_argument,
                            "torch_bridge: parameter " + std::to_string(i) +
                                "'s gradient was accumulated twice in one step; call backward once per step (add "
                                "micro-batches up with begin_step(gradwire::no_sync) steps)");
    delivered[i] = 1;
    sink(i, gradient_views[i]);
  }
};

// Runs after AccumulateGrad: its inputs are the incoming gradient, its outputs none.
// [docs:post_hook]
class accumulated_hook final : public torch::autograd::FunctionPostHook {
 public:
  accumulated_hook(hook_state* state, std::size_t index) : state_(state), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    state_->accumulated(index_);
    return outputs;
  }

 private:
  hook_state* state_;
  std::size_t index_;
};
// [/docs:post_hook]

}  // namespace detail

// Parameter i is the i-th tensor of the list given (model->parameters(): registration
// order, submodules depth first); backward produces their gradients roughly in reverse.
// Every parameter must be a float32, contiguous CPU tensor that requires grad (leave
// frozen ones out of the list). The bridge keeps the tensors (and so their memory) alive;
// build one per model, after the model, and before training it.
class module_bridge {
 public:
  explicit module_bridge(std::vector<torch::Tensor> parameters) : state_(std::make_unique<detail::hook_state>()) {
    auto& s = *state_;
    s.parameters = std::move(parameters);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < s.parameters.size(); ++i) {
      torch::Tensor& p = s.parameters[i];
      check(p, i);
      // [docs:register]
      // Allocated once; zero_grad() clears it in place, so gradient_views() stay valid.
      p.mutable_grad() = torch::zeros_like(p);
      s.gradients.push_back(p.grad());
      s.gradient_views.push_back(detail::view_of(p.grad()));
      // The parameter's AccumulateGrad node, kept alive here (the parameter holds it weakly).
      s.accumulators.push_back(torch::autograd::impl::grad_accumulator(p));
      s.hook_keys.push_back(
          s.accumulators.back()->add_post_hook(std::make_unique<detail::accumulated_hook>(state_.get(), i)));
      // [/docs:register]
    }
    s.delivered.assign(s.parameters.size(), 0);
  }
  explicit module_bridge(const torch::nn::Module& model) : module_bridge(model.parameters()) {}

  module_bridge(module_bridge&&) noexcept = default;
  module_bridge& operator=(module_bridge&&) = delete;  // would leave the old hooks behind
  module_bridge(const module_bridge&) = delete;
  module_bridge& operator=(const module_bridge&) = delete;
  ~module_bridge() {
    if (!state_) return;
    for (std::size_t i = 0; i < state_->accumulators.size(); ++i)
      state_->accumulators[i]->del_post_hook(state_->hook_keys[i]);
  }

  std::size_t size() const noexcept { return state_->parameters.size(); }

  // Views of the parameters' memory: what the strategy trains (its constructor writes rank
  // 0's values into every replica's model).
  std::vector<gradwire::tensor_view<float>> parameter_views() const {
    std::vector<gradwire::tensor_view<float>> views;
    for (const auto& p : state_->parameters) views.push_back(detail::view_of(p));
    return views;
  }
  // Views of the .grad tensors, for the one-call form strategy.step(gradient_views()).
  const std::vector<gradwire::tensor_view<float>>& gradient_views() const noexcept { return state_->gradient_views; }

  // Zeroes every .grad in place (never frees it), for the next step's accumulation. Call it
  // once a step has finished with the gradients (after step.finish() or strategy.step()).
  void zero_grad() {
    torch::NoGradGuard no_grad;
    for (auto& g : state_->gradients) g.zero_();
  }

  // Runs loss.backward() and hands each parameter's gradient to `step` (a strategy's
  // begin_step() handle) from inside it, with step.ready(i, gradient_views()[i]) as soon
  // as autograd has accumulated it; a parameter that got no gradient (not used by this
  // forward pass) is then marked step.unused(i). The caller then calls step.finish().
  template <class Step>
  void backward(const torch::Tensor& loss, Step& step) {
    auto& s = *state_;
    std::fill(s.delivered.begin(), s.delivered.end(), char{0});
    s.sink = [&step](std::size_t i, const gradwire::tensor_view<float>& grad) { step.ready(i, grad); };
    struct unhook {
      detail::hook_state& s;
      ~unhook() { s.sink = nullptr; }
    } unhook_after{s};
    loss.backward();
    for (std::size_t i = 0; i < s.delivered.size(); ++i)
      if (!s.delivered[i]) step.unused(i);
  }

 private:
  static void check(const torch::Tensor& p, std::size_t i) {
    auto fail = [i](const std::string& what, const std::string& fix) {
      throw gradwire::error(gradwire::errc::invalid_argument,
                            "torch_bridge: parameter " + std::to_string(i) + " " + what + "; " + fix);
    };
    if (!p.defined()) fail("is undefined", "pass the model's parameters (model->parameters())");
    if (!p.device().is_cpu())
      fail("is on " + p.device().str(), "this bridge views host memory: keep the model on the CPU");
    if (p.scalar_type() != torch::kFloat)
      fail(std::string("is ") + c10::toString(p.scalar_type()), "convert the model with model->to(torch::kFloat)");
    if (!p.is_contiguous()) fail("is not contiguous", "make it contiguous before building the bridge");
    if (!p.requires_grad()) fail("does not require grad", "leave frozen parameters out of the list");
    if (!p.is_leaf()) fail("is not a leaf tensor", "pass the module's registered parameters");
  }

  std::unique_ptr<detail::hook_state> state_;
};

}  // namespace torch_bridge
