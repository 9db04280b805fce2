// Where a failure becomes an error, for every transport: a rank's own failure as it travels, the kind and the text a
// rank reports for a peer's failure (and for a loss a peer relays), and which of a job's failures is the root cause.
//
// The wording is messages.hpp's; the transports decide only when a peer has failed (an
// abort frame, a control message, a broken connection after its grace, the in-process
// group's mark) and ask here what that becomes.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "../../error.hpp"
#include "messages.hpp"

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

// A rank's failure as it is told to its peers (an abort frame, a control message, the
// in-process group's mark): its kind and why.
struct rank_failure {
  errc cause = errc::peer_lost;
  std::string reason;
};

// Why a rank whose transport is destroyed while an exception unwinds fails (it will not
// finish what its peers wait for).
inline constexpr const char* unwinding_reason = "it is unwinding an exception";

// What a rank that ends with the exception `e` tells its peers: a gradwire::error keeps its
// kind and message; anything else is, to them, a lost peer, with what() as the reason.
inline rank_failure failure_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    return {x.kind(), x.what()};
  } catch (const std::exception& x) {
    return {errc::peer_lost, x.what()};
  } catch (...) {
    return {errc::peer_lost, "unknown exception"};
  }
}

// A peer's abort as it arrives. `lost` is the rank whose loss made the peer fail (-1: it
// failed for another reason): a rank that fails because it lost a peer says so, so that
// ranks which have not noticed that loss yet (shared memory notices a killed process only
// at its next keepalive) report it, not the aborting rank's closed endpoints.
struct abort_notice {
  errc cause = errc::peer_lost;
  int lost = -1;
  std::string reason;  // the peer's message; for a relayed loss, only why it was lost
};

// The peer's own reason, with the loss it relays folded in ("rank 1: lost rank 2: WHY").
inline std::string abort_reason(int peer, const abort_notice& notice) {
  return notice.lost >= 0 ? lost_peer_message(peer, notice.lost, notice.reason) : notice.reason;
}

// What a rank does when `peer` aborted with `notice`: it isolates `peer` (isolate_only: only
// the operations with it fail, with `report`), or it fails with `report` and tells its own
// peers `pass_on`.
struct peer_failure_outcome {
  bool isolate_only = false;
  rank_failure report;
  abort_notice pass_on;
};

// A relayed loss of a rank this rank does not tolerate reads as this rank's own loss of
// it, and is passed on as a loss, even when the messenger's own loss is tolerated (a
// parameter server hears from a worker that another server died: the job cannot go on,
// and the server must not read it as that worker's loss alone). Otherwise a tolerated
// peer is isolated, and an untolerated one failed (peer_failure_kind's rule), which is
// what is passed on.
inline peer_failure_outcome peer_failure(int rank, int peer, const abort_notice& notice, bool tolerates_peer,
                                         bool tolerates_lost) {
  if (notice.lost >= 0 && notice.lost != rank && !tolerates_lost)
    return {false,
            {errc::peer_lost, relayed_loss_message(rank, notice.lost, peer, notice.reason)},
            {errc::peer_lost, notice.lost, relayed_by(peer, notice.reason)}};
  if (tolerates_peer)
    return {true, {errc::peer_lost, tolerated_peer_failed_message(rank, peer, abort_reason(peer, notice))}, {}};
  rank_failure report{peer_failure_kind(notice.cause), peer_failed_message(rank, peer, abort_reason(peer, notice))};
  abort_notice pass_on{report.cause, -1, report.reason};
  return {false, std::move(report), std::move(pass_on)};
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
