// mpi's failures: an MPI error on an op, a peer's abort message (its kind by failure.hpp's rule), this rank's abort.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../detail/failure.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

// Ends op with MPI's error `code`: mpi_error_kind's errc; an error on a link loses the
// peer, and then neither the communicator is freed nor MPI finalised (both would wait for it).
inline void mpi_engine::fail_operation(mpi_op& op, int code) {
  const errc kind = mpi_error_kind(code);
  if (kind == errc::peer_lost) {
    link_lost = true;
    mpi_runtime::instance().peer_lost();
    return op.finish(kind, "rank " + std::to_string(options.rank) + ": " + describe(op) + " failed: lost rank " +
                               std::to_string(op.peer) + " (MPI: " + mpi_error_text(code) + ")");
  }
  op.finish(kind, "rank " + std::to_string(options.rank) + ": " + describe(op) + ": " + mpi_error_text(code));
}

// What an op a peer's abort ended reports (failed_rank >= 0).
inline std::string mpi_engine::abandoned_text(const mpi_op& op) const {
  return abandoned_by_message(options.rank, describe(op), failed_rank, failure_reason);
}

// Refuses a new op once a peer's abort has arrived.
inline void mpi_engine::throw_if_abandoned(const mpi_op& op) const {
  if (failed_rank < 0) return;
  throw error(failure_cause, abandoned_text(op));
}

// An abort message from a failed rank: [u32 cause][reason].
inline void mpi_engine::poll_control() {
  if (failed_rank >= 0) return;
  auto lock = mpi_runtime::instance().lock();
  int found = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status{};
  if (MPI_Improbe(MPI_ANY_SOURCE, tags.control(), comm, &found, &message, &status) != MPI_SUCCESS || !found) return;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<char> text(static_cast<std::size_t>(std::max(count, 4)));
  MPI_Mrecv(text.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  std::uint32_t cause = 0;
  std::memcpy(&cause, text.data(), sizeof cause);
  failed_rank = status.MPI_SOURCE;
  // Its kind here: every transport's rule (a mismatch, timeout or config error stays one).
  failure_cause = peer_failure_kind(static_cast<errc>(cause));
  failure_reason.assign(text.data() + sizeof cause, text.data() + std::max(count, 4));
}

// Tells every rank why this one fails (fail(), or a transport destroyed while an exception
// unwinds): an abort message each, which the destructor lets leave. Once, and not after a
// peer's abort (every rank has one to report then).
inline void mpi_engine::abort_all(errc cause, const std::string& reason) {
  if (failed_self || failed_rank >= 0 || !mpi_runtime::usable()) return;
  failed_self = true;
  const auto code = static_cast<std::uint32_t>(cause);
  abort_message.resize(sizeof code);
  std::memcpy(abort_message.data(), &code, sizeof code);
  abort_message += reason;
  auto lock = mpi_runtime::instance().lock();
  for (int r = 0; r < options.size; ++r) {
    if (r == options.rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(abort_message.data(), static_cast<int>(abort_message.size()), MPI_BYTE, r, tags.control(), comm,
                  &request) == MPI_SUCCESS)
      aborts.push_back(request);
  }
}

}  // namespace gradwire::transport::detail
