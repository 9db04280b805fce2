// SGD with (optionally Nesterov) momentum, PyTorch semantics with the velocity starting at zero.
#pragma once

#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "validate.hpp"

namespace gradwire::optim {

struct momentum_options {
  double lr = 0.01;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
};

class momentum {
 public:
  static constexpr const char* name = "momentum";
  using options = momentum_options;
  template <class T>
  struct state {
    aligned_buffer<T> velocity;

    // What a checkpoint saves: f(std::span<T>) per buffer, f(long&) per counter.
    template <class F>
    void for_each_buffer(F&& f) {
      f(velocity.span());
    }
    template <class F>
    void for_each_buffer(F&& f) const {
      f(velocity.span());
    }
    template <class F>
    void for_each_counter(F&&) {}
    template <class F>
    void for_each_counter(F&&) const {}
  };

  explicit momentum(options o = {}) : options_(o) {
    detail::require_non_negative("momentum", "lr", o.lr);
    detail::require_unit_interval("momentum", "momentum", o.momentum);
    detail::require_non_negative("momentum", "weight_decay", o.weight_decay);
  }

  const options& settings() const noexcept { return options_; }
  void set_lr(double lr) {
    detail::require_non_negative("momentum", "lr", lr);
    options_.lr = lr;
  }

  template <class T>
  state<T> init(std::size_t n) const {
    return {aligned_buffer<T>(n)};
  }

  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale = T(1)) const {
    detail::require_same_size("momentum", params.size(), grads.size(), s.velocity.size());
    kernels::momentum_step(params.data(), grads.data(), s.velocity.data(), params.size(), T(options_.lr),
                           T(options_.momentum), T(options_.weight_decay), options_.nesterov, grad_scale);
  }

 private:
  options options_;
};

static_assert(concepts::optimizer<momentum, float> && concepts::optimizer<momentum, double>);
static_assert(concepts::checkpointable_optimizer<momentum, float> && concepts::named_by_type<momentum> &&
              concepts::schedulable_optimizer<momentum>);

}  // namespace gradwire::optim
