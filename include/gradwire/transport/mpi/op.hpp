// mpi's op: what a send or receive carries while MPI holds it (its request, the message it matched, how MPI ended it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/network_op.hpp"
#include "runtime.hpp"

namespace gradwire::transport::detail {

// `complete` says MPI is done with the op (or never had it); the op is `done`
// (network_op: its failure and message set) once a wait has learnt how it ended (wait.ipp).
struct mpi_op : network_op {
  int mpi_tag = 0;                 // a receive: its tag folded into MPI's range (tags.hpp)
  bool matched = false;            // a receive: its message is known (MPI_Improbe) and being received
  bool wrong_size = false;         // a receive matched by a message of another size
  std::uint64_t arrived = 0;       // ... of this size
  std::vector<std::byte> discard;  // ... and where it goes
  MPI_Request request = MPI_REQUEST_NULL;
  bool complete = false;  // MPI finished it; `code` and `mpi_status` say how
  int code = MPI_SUCCESS;
  MPI_Status mpi_status{};
};

}  // namespace gradwire::transport::detail
