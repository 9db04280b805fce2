// Runs a job's ranks as threads of this process, for every job that does (inproc_group, simulation::job):
// one thread per rank, each rank's exception kept as its outcome, and what the job must do around it (tell the
// peers, hand over a baton) left to its hooks.
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "failure.hpp"

namespace gradwire::transport::detail {

// What a job does around its ranks' threads. A job's hooks derive from this and hide
// the members they change; run_ranks calls each as said here.
struct rank_hooks {
  // On rank r's thread, before fn(r). False: the rank runs nothing and leave() is not
  // called (the simulator's start was aborted).
  bool enter(int) { return true; }
  // On rank r's thread once fn(r) returned (nullopt) or threw (failure_of its exception,
  // which is the rank's outcome): what its peers must be told.
  void leave(int, std::optional<rank_failure>) {}
  // On the calling thread once every rank's thread has started; the threads are joined
  // after it returns.
  void started() {}
  // On the calling thread when a rank's thread could not start (`started` threads did),
  // before that error propagates; the started threads are joined after it returns.
  void start_failed(int /*started*/) {}
};

// Runs fn(r) for r in [0, size), each on a thread of its own, and returns each rank's
// outcome: the exception it ended with, null if it returned. A rank whose code must not
// count as failed (a modelled death) catches that inside fn. Returns once every thread has
// ended. Hooks: rank_hooks or derived from it.
template <class Fn, class Hooks>
std::vector<std::exception_ptr> run_ranks(int size, Fn&& fn, Hooks& hooks) {
  std::vector<std::exception_ptr> outcomes(static_cast<std::size_t>(size));
  {  // the threads are joined here, before outcomes is returned
    std::vector<std::jthread> threads;
    threads.reserve(outcomes.size());
    try {
      for (int r = 0; r < size; ++r)
        threads.emplace_back([&, r] {
          if (!hooks.enter(r)) return;
          std::optional<rank_failure> failure;
          try {
            fn(r);
          } catch (...) {
            outcomes[static_cast<std::size_t>(r)] = std::current_exception();
            failure = failure_of(outcomes[static_cast<std::size_t>(r)]);
          }
          hooks.leave(r, std::move(failure));
        });
    } catch (...) {
      hooks.start_failed(static_cast<int>(threads.size()));
      throw;
    }
    hooks.started();
  }
  return outcomes;
}

}  // namespace gradwire::transport::detail
