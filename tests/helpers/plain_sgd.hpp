// Test helper: the toy optimizer, p -= lr * scale * g with an empty state: no buffers to
// show (for_each_buffer), no device path, no set_lr. Host-only and without Catch2, so the
// compile-fail cases (nvcc's front end, tests/compile_fail) include it too.
#pragma once

#include <cstddef>
#include <span>

namespace gradwire::test {

struct plain_sgd {
  double lr = 0.1;
  template <class V>
  struct state {};
  template <class V>
  state<V> init(std::size_t) const {
    return {};
  }
  template <class V>
  void step(state<V>&, std::span<V> p, std::span<const V> g, V scale) const {
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<V>(lr) * scale * g[i];
  }
};

}  // namespace gradwire::test
