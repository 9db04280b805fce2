// In-process transport: N ranks as threads in one process, single-copy tagged messages.
//
// The pieces, one job each, under inproc/: wait_policy.hpp (how a waiting rank spins,
// yields and sleeps, and why), hub.hpp (the group's shared state: matching, moving the
// bytes in one pass, the failure mark), endpoint.hpp (transport::inproc, one rank's
// endpoint), group.hpp (inproc_group: endpoints and a thread per rank,
// detail/rank_runner.hpp). This header adds run_inproc, which rethrows a failed job's
// root cause; include it, not the pieces.
#pragma once

#include <string>
#include <utility>

#include "../error.hpp"
#include "../support/topology.hpp"
#include "detail/failure.hpp"
#include "inproc/endpoint.hpp"
#include "inproc/group.hpp"
#include "inproc/wait_policy.hpp"

namespace gradwire::transport {

// Runs fn(endpoint) on one thread per rank of `group` and rethrows the root cause if any
// rank failed: the first failure that is not a consequence (peer_lost) of another's.
template <class Fn>
void run_inproc(inproc_group group, Fn&& fn) {
  detail::rethrow_root_cause(group.run(std::forward<Fn>(fn)));
}

// As above on topology.size() threads, placed on the hosts `topology` says.
template <class Fn>
void run_inproc(cluster::topology topology, Fn&& fn) {
  run_inproc(inproc_group(std::move(topology)), std::forward<Fn>(fn));
}

// As above on `size` threads of one host.
template <class Fn>
void run_inproc(int size, Fn&& fn) {
  if (size < 1) throw error(errc::invalid_argument, "run_inproc: size must be >= 1, got " + std::to_string(size));
  run_inproc(cluster::topology::one_host(size), std::forward<Fn>(fn));
}

}  // namespace gradwire::transport
