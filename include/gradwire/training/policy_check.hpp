// policies_fit<Tensor, Optimizer, Aggregation, Transport>: strategy<>'s check of its four policies, each against its concept, with a message that says what is missing.
//
// strategy<> reads policies_fit<...>::value in a static_assert, first thing in its body, so
// these messages are the first errors a build with a policy that does not fit shows
// (tests/compile_fail/bad_policies.cpp checks their words). `value` is true even when an
// assertion fails, so the strategy adds no error of its own to the one here.
#pragma once

#include "../concepts.hpp"

namespace gradwire::training {

template <class Tensor, class Optimizer, class Aggregation, class Transport>
struct policies_fit {
  static_assert(concepts::tensor<Tensor>,
                "gradwire::strategy: Tensor does not satisfy gradwire::concepts::tensor: it needs value_type (float or "
                "double), a static `location`, data(), size() and shape() (see gradwire/concepts.hpp)");
  static_assert(concepts::optimizer<Optimizer, typename Tensor::value_type>,
                "gradwire::strategy: Optimizer does not satisfy gradwire::concepts::optimizer for Tensor's value_type: it "
                "needs template<class V> struct state, init<V>(n) and step(state, params, grads, grad_scale) "
                "(see gradwire/concepts.hpp)");
  static_assert(concepts::transport<Transport>,
                "gradwire::strategy: Transport does not satisfy gradwire::concepts::transport: it needs rank(), size(), "
                "async_send, async_recv, wait(request, deadline) and a nested request type (see "
                "gradwire/concepts.hpp)");
  static_assert(concepts::aggregation<Aggregation, typename Tensor::value_type, Transport>,
                "gradwire::strategy: Aggregation does not satisfy gradwire::concepts::aggregation: it needs an agent "
                "template (agent<V, Transport> with setup, begin_step, ready, finish_step) or setup(comm, params) and "
                "step(comm, params, grads, apply) (see gradwire/concepts.hpp)");
  static constexpr bool value = true;
};

}  // namespace gradwire::training
