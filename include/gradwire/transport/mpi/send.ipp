// mpi's send path: MPI_Isend, with messages of 2 GiB or more counted in 4-byte units.
#pragma once

#include <climits>
#include <string>
#include <utility>

#include "engine.hpp"

namespace gradwire::transport::detail {

// MPI counts are ints: messages of 2 GiB or more travel in 4-byte units (every
// gradwire tensor's size is a multiple of 4).
inline std::pair<int, MPI_Datatype> mpi_engine::count_of(std::size_t bytes) {
  if (bytes <= static_cast<std::size_t>(INT_MAX)) return {static_cast<int>(bytes), MPI_BYTE};
  if (bytes % 4 == 0 && bytes / 4 <= static_cast<std::size_t>(INT_MAX))
    return {static_cast<int>(bytes / 4), MPI_INT32_T};
  throw error(errc::invalid_argument, "mpi: a message of " + std::to_string(bytes) +
                                          " bytes: above 2 GiB, sizes must be multiples of 4 and below 8 GiB");
}

inline void mpi_engine::post_send(mpi_op& op) {
  throw_if_abandoned(op);
  const auto [count, type] = count_of(op.bytes);
  auto lock = mpi_runtime::instance().lock();
  const int code = MPI_Isend(op.data, count, type, op.peer, tags.fold(op.tag), comm, &op.request);
  if (code != MPI_SUCCESS) {
    op.complete = true;  // nothing for MPI to withdraw
    fail_operation(op, code);
    throw error(op.failure, op.message);
  }
}

}  // namespace gradwire::transport::detail
