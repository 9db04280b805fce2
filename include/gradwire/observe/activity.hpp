// What this thread is doing for gradwire (collective name, operation number) and the training step: for stall reports.
//
// A transport that has waited long for a peer names what it was waiting in ("all_reduce,
// operation #12, step 40"). The names come from here: trace scopes set the collective's
// name, communicator::begin_operation its number, the strategy the step. Each is one
// plain store (thread-local, or a relaxed atomic for the step), so the small-message path
// pays nothing it would notice; they are read only once a wait has lasted seconds.
#pragma once

#include <atomic>
#include <cstdint>

namespace gradwire::observe {

struct activity {
  const char* name = nullptr;   // a string literal ("all_reduce", "push", ...), or nullptr
  std::uint64_t operation = 0;  // the communicator's operation sequence number; 0: none yet
};

// The calling thread's current activity (collectives may run on a background thread).
inline activity& current_activity() noexcept {
  static thread_local activity a;
  return a;
}

// The training step this process is in (strategy::step counts from 1); 0: not training.
inline std::atomic<std::uint64_t>& current_step() noexcept {
  static std::atomic<std::uint64_t> step{0};
  return step;
}

}  // namespace gradwire::observe
