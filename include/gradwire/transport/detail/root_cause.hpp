// A peer's failure as a rank reports it, and which of a job's per-rank failures is the root cause, not a consequence.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "../../error.hpp"

namespace gradwire::transport::detail {

// The kind a rank reports when a peer failed with `cause` (what its abort frame, control
// message or the in-process group carries): the one rule of every transport. A
// disagreement between ranks (mismatch), a deadline that passed (timeout) and a bad
// setting (config) belong to the job, not to the rank that noticed first: ranks given the
// same bad option, or waiting for the same missing rank, race to notice it, and whichever
// hears of it from a faster peer first must still report the same kind as the ranks that
// noticed it themselves. Anything else (a peer that threw, was killed, received a bad
// frame, or lost a peer itself) is, to this rank, a lost peer.
inline constexpr errc peer_failure_kind(errc cause) noexcept {
  switch (cause) {
    case errc::mismatch:
    case errc::timeout:
    case errc::config: return cause;
    default: return errc::peer_lost;
  }
}

// Rethrows the root cause of a job's per-rank failures, else the first failure; returns if
// no rank failed. `outcomes` holds each rank's (null: success). A failure is a consequence
// of another's when it is a peer_lost, or when its message quotes another rank's (a kind
// that travels, peer_failure_kind: "rank 1: rank 0 failed: " + rank 0's); the root cause
// is the first failure that is neither.
inline void rethrow_root_cause(const std::vector<std::exception_ptr>& outcomes) {
  struct failure {
    std::exception_ptr e;
    bool lost = false;    // a peer_lost
    std::string details;  // a gradwire::error's message without its kind; empty otherwise
  };
  std::vector<failure> failures;
  for (const auto& e : outcomes) {
    if (!e) continue;
    failure f{e, false, {}};
    try {
      std::rethrow_exception(e);
    } catch (const error& x) {
      f.lost = x.kind() == errc::peer_lost;
      f.details = x.details();
    } catch (...) {
    }
    failures.push_back(std::move(f));
  }
  if (failures.empty()) return;
  auto quotes_another = [&](const failure& f) {
    for (const auto& o : failures)
      if (&o != &f && !o.details.empty() && o.details.size() < f.details.size() &&
          f.details.find(o.details) != std::string::npos)
        return true;
    return false;
  };
  for (const auto& f : failures)
    if (!f.lost && !quotes_another(f)) std::rethrow_exception(f.e);
  std::rethrow_exception(failures.front().e);
}

}  // namespace gradwire::transport::detail
