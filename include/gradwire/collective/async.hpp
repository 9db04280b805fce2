// Non-blocking collectives: queue them on a communicator's background thread, wait on a handle later.
//
// Each communicator owns one async_engine (communicator::async(), started on first use);
// see async_engine.hpp for the rules that keep buffers safe.
#pragma once

#include <span>

#include "all_reduce.hpp"
#include "async_engine.hpp"
#include "communicator.hpp"

namespace gradwire::collective {

// Starts an all_reduce of `data` (see all_reduce) on the engine's thread. `data` must
// stay alive and untouched until the handle's wait() returns.
template <class Algorithm = auto_, class Tr, class V>
async_handle async_all_reduce(async_engine<Tr>& engine, std::span<V> data, reduce_op op = reduce_op::sum) {
  return engine.submit([data, op](communicator<Tr>& comm) { all_reduce<Algorithm>(comm, data, op); });
}

}  // namespace gradwire::collective
