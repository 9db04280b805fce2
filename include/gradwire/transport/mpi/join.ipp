// How a rank joins an MPI job and leaves it: the communicator duplicated (and freed at the end), host names exchanged.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Collective over options.comm. Initialises MPI if nobody has.
inline void mpi_engine::join() {
  mpi_runtime::instance().ensure(options.thread_level);
  const auto until = clock::now() + options.connect_timeout;
  {
    MPI_Request r = MPI_REQUEST_NULL;
    auto lock = mpi_runtime::instance().lock();
    MPI_Comm_idup(options.comm == MPI_COMM_NULL ? MPI_COMM_WORLD : options.comm, &comm, &r);
    lock.unlock();
    join_wait(r, until, "duplicating the communicator");
  }
  auto lock = mpi_runtime::instance().lock();
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &options.rank);
  MPI_Comm_size(comm, &options.size);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found);
  tags = mpi_tags(found && tag_ub ? *tag_ub : 32767);
  lock.unlock();
  exchange_hosts(until);
  dedicated = support::cpu_per_rank(topology.local_size(options.rank));
  joined = true;
}

// A join that failed leaves its requests and communicator to MPI: the job cannot go on anyway.
inline mpi_engine::~mpi_engine() {
  if (!joined || !mpi_runtime::usable()) return;
  auto lock = mpi_runtime::instance().lock();
  // Abort messages leave (briefly waited for), then the communicator goes, unless a
  // peer is lost (freeing it may wait for the peer).
  const auto until = clock::now() + options.abort_flush;
  for (auto& r : aborts) {
    for (int done = 0; !done && clock::now() < until;) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (!done) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
      }
    }
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  if (!link_lost && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

inline void mpi_engine::join_wait(MPI_Request& r, deadline until, const char* what) {
  mpi_backoff backoff(options, nullptr);
  for (;;) {
    int done = 0;
    {
      auto lock = mpi_runtime::instance().lock();
      const int code = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS)
        throw error(mpi_error_kind(code),
                    std::string("transport::mpi: ") + what + " failed: " + mpi_error_text(code));
    }
    if (done) return;
    if (clock::now() > until)  // the request stays with MPI: the job cannot go on anyway
      throw error(errc::timeout, std::string("transport::mpi: ") + what + " did not complete within " +
                                     std::to_string(options.connect_timeout.count()) +
                                     " ms: did every rank of the communicator build its transport?");
    backoff.pause();
  }
}

// Every rank's host name, so that topology() tells which ranks share a host.
inline void mpi_engine::exchange_hosts(deadline until) {
  constexpr int width = MPI_MAX_PROCESSOR_NAME;
  std::string mine = options.host_id;
  if (mine.empty())
    if (const char* id = std::getenv("GRADWIRE_HOST_ID"); id && *id) mine = id;
  if (mine.empty()) {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    mine.assign(name, static_cast<std::size_t>(length));
  }
  mine.resize(width - 1, '\0');
  std::vector<char> all(static_cast<std::size_t>(width) * options.size);
  MPI_Request r = MPI_REQUEST_NULL;
  {
    auto lock = mpi_runtime::instance().lock();
    MPI_Iallgather(mine.data(), width - 1, MPI_CHAR, all.data(), width - 1, MPI_CHAR, comm, &r);
  }
  join_wait(r, until, "exchanging host names");
  std::vector<std::string> hosts;
  for (int k = 0; k < options.size; ++k) hosts.emplace_back(all.data() + static_cast<std::size_t>(k) * (width - 1));
  topology = cluster::topology::from_identities(hosts, hosts);
}

}  // namespace gradwire::transport::detail
