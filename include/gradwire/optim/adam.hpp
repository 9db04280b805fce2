// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay).
#pragma once

#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "../kernels/host.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "validate.hpp"

namespace gradwire::optim {

namespace detail {

template <bool Decoupled>
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = Decoupled ? 1e-2 : 0.0;  // PyTorch's defaults
};

// Adam and AdamW differ only in how weight decay enters; one class template serves both.
template <bool Decoupled>
class adam_family {
 public:
  static constexpr const char* name = Decoupled ? "adamw" : "adam";
  using options = adam_options<Decoupled>;
  template <class T>
  struct state {
    aligned_buffer<T> m, v;  // first and second moment estimates
    long step = 0;           // steps taken, for bias correction

    // What a checkpoint saves: f(std::span<T>) per buffer, f(long&) per counter.
    template <class F>
    void for_each_buffer(F&& f) {
      f(m.span());
      f(v.span());
    }
    template <class F>
    void for_each_buffer(F&& f) const {
      f(m.span());
      f(v.span());
    }
    template <class F>
    void for_each_counter(F&& f) {
      f(step);
    }
    template <class F>
    void for_each_counter(F&& f) const {
      f(step);
    }
  };

  explicit adam_family(options o = {}) : options_(o) {
    require_non_negative(name, "lr", o.lr);
    require_unit_interval(name, "beta1", o.beta1);
    require_unit_interval(name, "beta2", o.beta2);
    require_positive(name, "eps", o.eps);
    require_non_negative(name, "weight_decay", o.weight_decay);
  }

  const options& settings() const noexcept { return options_; }
  void set_lr(double lr) {
    require_non_negative(name, "lr", lr);
    options_.lr = lr;
  }

  template <class T>
  state<T> init(std::size_t n) const {
    return {aligned_buffer<T>(n), aligned_buffer<T>(n), 0};
  }

  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale = T(1)) const {
    require_same_size(name, params.size(), grads.size(), s.m.size());
    ++s.step;
    const auto c = kernels::adam_coefficients<T>::make(options_.lr, options_.beta1, options_.beta2, options_.eps,
                                                       options_.weight_decay, Decoupled, s.step, grad_scale);
    kernels::adam_step(params.data(), grads.data(), s.m.data(), s.v.data(), params.size(), c);
  }

 private:
  options options_;
};

}  // namespace detail

using adam = detail::adam_family<false>;
using adamw = detail::adam_family<true>;

static_assert(concepts::optimizer<adam, float> && concepts::optimizer<adamw, double>);
static_assert(concepts::checkpointable_optimizer<adam, float> && concepts::checkpointable_optimizer<adamw, double> &&
              concepts::named_by_type<adam> && concepts::named_by_type<adamw> &&
              concepts::schedulable_optimizer<adam> && concepts::schedulable_optimizer<adamw>);

}  // namespace gradwire::optim
