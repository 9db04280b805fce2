// Plain SGD with optional (L2) weight decay: p -= lr * (g + wd * p).
#pragma once

#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "validate.hpp"

namespace gradwire::optim {

struct sgd_options {
  double lr = 0.01;
  double weight_decay = 0.0;
};

class sgd {
 public:
  static constexpr const char* name = "sgd";
  using options = sgd_options;
  template <class T>
  struct state {
    std::size_t size = 0;  // stateless but for the length it was made for

    // What a checkpoint saves: no buffers, no counters (size comes from init).
    template <class F>
    void for_each_buffer(F&&) {}
    template <class F>
    void for_each_buffer(F&&) const {}
    template <class F>
    void for_each_counter(F&&) {}
    template <class F>
    void for_each_counter(F&&) const {}
  };

  explicit sgd(options o = {}) : options_(o) {
    detail::require_non_negative("sgd", "lr", o.lr);
    detail::require_non_negative("sgd", "weight_decay", o.weight_decay);
  }

  const options& settings() const noexcept { return options_; }
  void set_lr(double lr) {
    detail::require_non_negative("sgd", "lr", lr);
    options_.lr = lr;
  }

  template <class T>
  state<T> init(std::size_t n) const {
    return {n};
  }

  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale = T(1)) const {
    detail::require_same_size("sgd", params.size(), grads.size(), s.size);
    kernels::sgd_step(params.data(), grads.data(), params.size(), T(options_.lr), T(options_.weight_decay),
                      grad_scale);
  }

 private:
  options options_;
};

static_assert(concepts::optimizer<sgd, float> && concepts::optimizer<sgd, double>);
static_assert(concepts::checkpointable_optimizer<sgd, float> && concepts::named_by_type<sgd> &&
              concepts::schedulable_optimizer<sgd>);

}  // namespace gradwire::optim
