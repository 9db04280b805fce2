// mpi's waits: test-and-wait until MPI completes an op or its deadline passes, an op's outcome, and withdrawing an op.
#pragma once

#include <chrono>
#include <thread>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Tests op until it is done (true) or `until` passes (false: the shared wait withdraws it
// and throws timeout); a peer's abort ends it with that peer's reason.
inline bool mpi_engine::progress(mpi_op& op, deadline until) {
  mpi_backoff backoff(options, dedicated ? &spin : nullptr);
  for (unsigned i = 0;; ++i) {
    if (test(op)) return true;
    if (i % 64 == 0 || backoff.sleeping()) poll_control();
    if (failed_rank >= 0) return op.finish(failure_cause, abandoned_text(op)), true;
    if (clock::now() > until) return false;
    backoff.pause();
  }
}

// Completes `op` if MPI has; true once it is done (its outcome in op: conclude).
inline bool mpi_engine::test(mpi_op& op) {
  if (op.state == status::done) return true;
  if (!op.complete) {
    if (!op.is_send && !op.matched) {
      match_receives();
      if (!op.matched) return false;
    }
    if (!op.complete) {
      int done = 0;
      auto lock = mpi_runtime::instance().lock();
      op.code = MPI_Test(&op.request, &done, &op.mpi_status);
      // With MPI_ERRORS_RETURN a failed operation is complete too (its request freed).
      if (op.code != MPI_SUCCESS) done = 1;
      op.complete = done != 0;
      if (!op.complete) return false;
    }
  }
  conclude(op);
  return true;
}

// The outcome of an op MPI completed: MPI's error, a message of another size, or success.
inline void mpi_engine::conclude(mpi_op& op) {
  if (op.code != MPI_SUCCESS) return fail_operation(op, op.code);
  if (op.wrong_size)
    return op.finish(errc::mismatch, size_mismatch_message(op.peer, op.arrived, op.tag, options.rank, op.bytes));
  op.finish();
}

// Withdraws an op that will not be waited for. A receive whose message has not come
// is simply forgotten; one whose message is arriving is let finish (a bounded wait:
// it may be writing into the buffer). MPI cannot reliably cancel a send, so a send is
// left to complete (MPI may still read its buffer: after a timeout the job is over,
// and a dropped send was matched or never will be).
inline void mpi_engine::cancel(mpi_op& op) noexcept {
  if (!op.is_send && !op.matched) {
    unqueue(op);
    op.complete = true;
    return;
  }
  if (op.complete || op.request == MPI_REQUEST_NULL || !mpi_runtime::usable()) return;
  auto lock = mpi_runtime::instance().lock();
  if (!op.is_send && !link_lost) {
    const auto until = clock::now() + options.abort_flush;
    for (int done = 0; !done && clock::now() < until;) {
      if (MPI_Test(&op.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
      }
    }
  }
  if (op.request != MPI_REQUEST_NULL) MPI_Request_free(&op.request);
  op.complete = true;
}

}  // namespace gradwire::transport::detail
