// Which of a job's per-rank failures to report: the root cause, not its consequences.
#pragma once

#include <exception>
#include <vector>

#include "../../error.hpp"

namespace gradwire::transport::detail {

// Rethrows the first failure that is not a consequence (peer_lost) of another's, else the
// first failure; returns if no rank failed. `outcomes` holds each rank's (null: success).
inline void rethrow_root_cause(const std::vector<std::exception_ptr>& outcomes) {
  std::exception_ptr first, root;
  for (const auto& e : outcomes) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const error& x) {
      if (!root && x.kind() != errc::peer_lost) root = e;
    } catch (...) {
      if (!root) root = e;
    }
  }
  if (root || first) std::rethrow_exception(root ? root : first);
}

}  // namespace gradwire::transport::detail
