// How a rank joins a job over MPI (mpi_options): the communicator, thread level, join timeout, polling, host.
#pragma once

#include <chrono>
#include <string>

#include "../../timeouts.hpp"
#include "runtime.hpp"  // <mpi.h>, C API only

namespace gradwire::transport {

// Ranks and the world size come from the communicator, not from these.
struct mpi_options {
  // The ranks of the job: a duplicate of this communicator (MPI_COMM_NULL: of
  // MPI_COMM_WORLD), so that gradwire's messages never meet the program's own.
  MPI_Comm comm = MPI_COMM_NULL;
  // Asked of MPI_Init_thread when gradwire initialises MPI (mpi/runtime.hpp says why
  // SERIALIZED is enough, and when a program needs MULTIPLE).
  int thread_level = MPI_THREAD_SERIALIZED;
  // Joining (duplicating the communicator, exchanging host names) must finish within this.
  std::chrono::milliseconds connect_timeout = default_timeout;
  // Test-and-wait: hot polling first, then sleeps between polls up to max_sleep.
  std::chrono::microseconds poll_before_sleep{200};
  std::chrono::microseconds max_sleep{500};
  // How long a failing rank's destructor lets its abort messages leave.
  std::chrono::milliseconds abort_flush{1000};
  // This rank's host (which ranks share one: topology()); empty: GRADWIRE_HOST_ID if
  // set, else MPI_Get_processor_name.
  std::string host_id;
};

}  // namespace gradwire::transport
