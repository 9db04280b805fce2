// mpi's receive path: a message matched (MPI_Improbe) and its size checked before MPI_Imrecv lets it land.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "engine.hpp"

namespace gradwire::transport::detail {

inline void mpi_engine::post_recv(mpi_op& op) {
  throw_if_abandoned(op);
  count_of(op.bytes);  // refuses a size MPI cannot count before anything is queued
  op.mpi_tag = tags.fold(op.tag);
  unmatched.push_back(&op);
  match_receives();
}

// Matches the receives still waiting for their message, in the order they were
// posted per (peer, MPI tag): a later one waits while an earlier one with the same
// pair is unmatched, as under MPI's non-overtaking rule.
inline void mpi_engine::match_receives() {
  if (unmatched.empty()) return;
  auto lock = mpi_runtime::instance().lock();
  for (std::size_t i = 0; i < unmatched.size();) {
    mpi_op& op = *unmatched[i];
    const bool behind = std::any_of(unmatched.begin(), unmatched.begin() + static_cast<std::ptrdiff_t>(i),
                                    [&](const mpi_op* o) { return o->peer == op.peer && o->mpi_tag == op.mpi_tag; });
    if (behind || !match(op)) {
      ++i;
      continue;
    }
    unmatched.erase(unmatched.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

// True once op's message is found and being received (lock held).
inline bool mpi_engine::match(mpi_op& op) {
  int found = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status{};
  int code = MPI_Improbe(op.peer, op.mpi_tag, comm, &found, &message, &status);
  if (code == MPI_SUCCESS && !found) return false;
  op.matched = true;
  if (code == MPI_SUCCESS) {
    MPI_Count count = 0;
    MPI_Get_elements_x(&status, MPI_BYTE, &count);
    std::byte* into = op.data;
    if (static_cast<std::uint64_t>(count) != op.bytes) {  // taken, so the next message can match
      op.wrong_size = true;
      op.arrived = static_cast<std::uint64_t>(count);
      op.discard.resize(static_cast<std::size_t>(count));
      into = op.discard.data();
    }
    const auto [n, type] = count_of(static_cast<std::size_t>(count));
    code = MPI_Imrecv(into, n, type, &message, &op.request);
  }
  if (code != MPI_SUCCESS) {
    op.code = code;
    op.complete = true;
  }
  return true;
}

inline void mpi_engine::unqueue(const mpi_op& op) noexcept {
  unmatched.erase(std::remove(unmatched.begin(), unmatched.end(), &op), unmatched.end());
}

}  // namespace gradwire::transport::detail
