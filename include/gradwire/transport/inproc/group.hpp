// A group of in-process ranks (inproc_group): one hub, an endpoint per rank, and a thread per rank to run them.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../support/topology.hpp"
#include "../../support/waiting.hpp"
#include "../detail/failure.hpp"
#include "../detail/rank_runner.hpp"
#include "endpoint.hpp"
#include "hub.hpp"
#include "wait_policy.hpp"

namespace gradwire::transport {

// A group of N in-process ranks: hands out endpoints and runs one thread per rank.
class inproc_group {
 public:
  // `wait_policy`: how waiting ranks wait (default: chosen for `size` threads on the CPUs
  // this process may use; see wait_policy.hpp).
  explicit inproc_group(int size) : inproc_group(size, choose_wait_policy(size, support::usable_cpus())) {}
  inproc_group(int size, inproc_wait_policy wait_policy) {
    if (size < 1) throw error(errc::invalid_argument, "inproc_group: size must be >= 1, got " + std::to_string(size));
    hub_ = std::make_shared<detail::inproc_hub>(size, cluster::topology::one_host(size), wait_policy);
  }
  // Threads that pretend to sit on the hosts `topology` says (tests of topology-aware
  // collectives): one rank per rank of the topology.
  explicit inproc_group(cluster::topology topology)
      : inproc_group(topology, choose_wait_policy(topology.size(), support::usable_cpus())) {}
  inproc_group(cluster::topology topology, inproc_wait_policy wait_policy) {
    const int size = topology.size();
    hub_ = std::make_shared<detail::inproc_hub>(size, std::move(topology), wait_policy);
  }

  int size() const noexcept { return hub_->size(); }
  const inproc_wait_policy& wait_policy() const noexcept { return hub_->wait_policy(); }
  inproc endpoint(int rank) const { return inproc(hub_, rank); }

  // Runs fn(endpoint) on one thread per rank and returns each rank's outcome (null on
  // success). A rank that throws marks itself failed, so the others stop waiting.
  template <class Fn>
  std::vector<std::exception_ptr> run(Fn&& fn) {
    fail_peers hooks{{}, hub_.get()};
    return detail::run_ranks(size(), [&](int r) { fn(endpoint(r)); }, hooks);
  }

 private:
  // A rank that threw marks the hub failed, naming it (hub.hpp).
  struct fail_peers : detail::rank_hooks {
    detail::inproc_hub* hub;
    void leave(int r, std::optional<detail::rank_failure> failure) {
      if (failure) hub->fail(r, failure->cause, failure->reason);
    }
  };

  std::shared_ptr<detail::inproc_hub> hub_;
};

}  // namespace gradwire::transport
