// The model the checkpoint harness loads into and make_corpus saves from: three tensors
// (3, 0 and 5 elements) and one optimizer's state per tensor, values from a seed.
#pragma once

#include <gradwire/checkpoint.hpp>
#include <gradwire/optim/adam.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/sgd.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace gradwire::fuzz {

inline constexpr std::size_t checkpoint_tensor_sizes[] = {3, 0, 5};

template <class V, class Optimizer>
struct checkpoint_model {
  using value_type = V;
  using optimizer_type = Optimizer;
  using state_type = typename Optimizer::template state<V>;

  explicit checkpoint_model(const Optimizer& o, unsigned seed) {
    for (std::size_t n : checkpoint_tensor_sizes) {
      storage.emplace_back(n);
      states.push_back(o.template init<V>(n));
    }
    for (auto& t : storage) tensors.emplace_back(t);
    fill(seed);
  }
  // Every parameter, buffer and counter from `seed`, so that two models compare equal
  // only when their contents do.
  void fill(unsigned seed) {
    unsigned x = seed;
    auto next = [&] { return x = x * 1103515245u + 12345u; };
    for (auto& t : storage)
      for (auto& v : t) v = static_cast<V>(next() % 1000) / V(8);
    for (auto& s : states) {
      s.for_each_buffer([&](std::span<V> b) {
        for (auto& v : b) v = static_cast<V>(next() % 1000) / V(16);
      });
      s.for_each_counter([&](long& c) { c = static_cast<long>(next() % 100); });
    }
  }

  std::span<const std::span<V>> parameters() const noexcept { return tensors; }
  std::span<const state_type> optimizer_states() const noexcept { return states; }
  std::span<state_type> optimizer_states() noexcept { return states; }

  std::vector<std::vector<V>> storage;
  std::vector<std::span<V>> tensors;
  std::vector<state_type> states;
};

}  // namespace gradwire::fuzz
