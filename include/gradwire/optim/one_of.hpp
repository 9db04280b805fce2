// An optimizer chosen at run time among a few known at compile time:
//
//   using any_optimizer = gw::optim::one_of<gw::optim::sgd, gw::optim::adam>;
//   any_optimizer o = flag == "sgd" ? any_optimizer(gw::optim::sgd({.lr = 0.1})) : gw::optim::adam{};
//
// A strategy over one_of is compiled once, not once per optimizer: a program that offers a
// choice of optimizers (a command-line flag) pays each strategy's compile time once. The
// choice costs one branch per tensor step; the update itself is the chosen optimizer's.
// Checkpoints name the chosen optimizer (o.name()), so a file saved with adam loads into a
// one_of holding adam, and one holding adamw refuses it as before.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "../concepts.hpp"
#include "../error.hpp"

namespace gradwire::optim {

template <class... Os>
class one_of {
  static_assert(sizeof...(Os) >= 1, "optim::one_of needs at least one optimizer");

  // Each alternative's index is its type's: distinct types, or a choice could not be told apart.
  template <class O>
  static constexpr std::size_t count_of = (std::size_t{std::is_same_v<O, Os>} + ...);
  static_assert(((count_of<Os> == 1) && ...), "optim::one_of: each optimizer may be listed once");

  // f(integral_constant<I>) for the chosen index I, and its result. Optimizer and state are
  // matched by index, not type: two optimizers may share a state type.
  template <std::size_t I = 0, class F>
  static decltype(auto) at_chosen(std::size_t chosen, F&& f) {
    if constexpr (I + 1 < sizeof...(Os))
      if (chosen != I) return at_chosen<I + 1>(chosen, std::forward<F>(f));
    return std::forward<F>(f)(std::integral_constant<std::size_t, I>{});
  }

 public:
  // Per-tensor state: the chosen optimizer's (which alternative it is made for is kept).
  template <class T>
  struct state {
    std::variant<typename Os::template state<T>...> chosen;

    // What a checkpoint saves: the chosen optimizer's buffers and counters.
    template <class F>
    void for_each_buffer(F&& f) {
      std::visit([&](auto& s) { s.for_each_buffer(f); }, chosen);
    }
    template <class F>
    void for_each_buffer(F&& f) const {
      std::visit([&](const auto& s) { s.for_each_buffer(f); }, chosen);
    }
    template <class F>
    void for_each_counter(F&& f) {
      std::visit([&](auto& s) { s.for_each_counter(f); }, chosen);
    }
    template <class F>
    void for_each_counter(F&& f) const {
      std::visit([&](const auto& s) { s.for_each_counter(f); }, chosen);
    }
  };

  template <class O>
    requires(count_of<std::remove_cvref_t<O>> == 1)
  one_of(O&& o) : chosen_(std::forward<O>(o)) {}  // NOLINT(google-explicit-constructor): a choice is its optimizer

  // The chosen optimizer's name ("adam"): what a checkpoint records.
  std::string_view name() const noexcept {
    return std::visit([](const auto& o) -> std::string_view { return o.name; }, chosen_);
  }
  // Whether O is the one chosen, and it (nullptr when another is).
  template <class O>
  bool holds() const noexcept {
    return std::holds_alternative<O>(chosen_);
  }
  template <class O>
  const O* get_if() const noexcept {
    return std::get_if<O>(&chosen_);
  }

  // For a learning-rate schedule: the chosen optimizer's set_lr (each alternative needs one).
  void set_lr(double lr)
    requires(concepts::schedulable_optimizer<Os> && ...)
  {
    std::visit([&](auto& o) { o.set_lr(lr); }, chosen_);
  }

  template <class T>
  state<T> init(std::size_t n) const {
    using chosen_state = decltype(state<T>::chosen);
    return at_chosen(chosen_.index(), [&](auto i) {
      return state<T>{chosen_state(std::in_place_index<i()>, std::get<i()>(chosen_).template init<T>(n))};
    });
  }

  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale = T(1)) const {
    if (s.chosen.index() != chosen_.index())
      throw error(errc::invalid_argument, "optim::one_of: a state made for another optimizer than '" +
                                              std::string(name()) + "' (init with the optimizer that steps)");
    at_chosen(chosen_.index(), [&](auto i) {
      std::get<i()>(chosen_).step(std::get<i()>(s.chosen), params, grads, grad_scale);
    });
  }

 private:
  std::variant<Os...> chosen_;
};

}  // namespace gradwire::optim
