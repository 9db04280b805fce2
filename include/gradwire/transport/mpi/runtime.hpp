// The process's MPI library as gradwire uses it: initialised once at the thread level it needs, calls serialised, errors mapped.
//
// Thread level. gradwire's communicator runs collectives on a background thread (the
// async engine) and the caller's thread waits on them, so transport calls come from more
// than one thread, one at a time: MPI_THREAD_SERIALIZED is enough for gradwire itself.
// Every MPI call of the transport holds this runtime's lock, so several transports
// (communicators) on different threads stay serialised too. Only a program that calls
// MPI itself, on another thread, while gradwire's engine runs, needs MPI_THREAD_MULTIPLE.
// FUNNELED or SINGLE is refused with errc::config: the engine thread is not the main one.
//
// Initialisation. If MPI is not initialised when the first mpi transport is built, the
// runtime initialises it (MPI_Init_thread at the level mpi_options asks for) and
// finalises it at exit, unless a peer was lost (MPI_Finalize synchronises with every
// rank, and a lost one never arrives: the launcher ends the job instead). A program that
// initialised MPI itself finalises it itself, after its transports are gone.
#pragma once

// MPI's C API only: the deprecated C++ bindings (OpenMPI, MPICH) stay out of every translation unit.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>

#include "../../error.hpp"

namespace gradwire::transport::detail {

inline std::string mpi_thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "thread level " + std::to_string(level);
}

// MPI's text for an error code ("MPI_ERR_TRUNCATE: message truncated").
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

// How an MPI error class reads as a gradwire error: a message larger than its receive is
// a mismatch between ranks, a bad argument is the caller's, and the rest (MPI_ERR_OTHER,
// MPI_ERR_INTERN, ULFM's MPIX_ERR_PROC_FAILED, a broken connection) means the peer is gone.
inline errc mpi_error_kind(int code) {
  int error_class = code;
  MPI_Error_class(code, &error_class);
  switch (error_class) {
    case MPI_ERR_TRUNCATE: return errc::mismatch;
    case MPI_ERR_ARG:
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_RANK:
    case MPI_ERR_TAG:
    case MPI_ERR_TYPE: return errc::invalid_argument;
    default: return errc::peer_lost;
  }
}

class mpi_runtime {
 public:
  static mpi_runtime& instance() {
    static mpi_runtime runtime;
    return runtime;
  }

  // Initialises MPI at `wanted` if nobody has, and checks that the level it provides lets
  // gradwire's engine thread call it. Returns the level provided.
  int ensure(int wanted) {
    std::lock_guard lock(mutex_);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw error(errc::config, "transport::mpi: MPI was already finalised: build transports before MPI_Finalize");
    if (!initialised) {
      int provided = MPI_THREAD_SINGLE;
      // MPI_Init_thread aborts on failure whatever the error handler says: there is no
      // communicator yet to say MPI_ERRORS_RETURN on.
      MPI_Init_thread(nullptr, nullptr, wanted, &provided);
      owned_ = true;
    }
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      throw error(errc::config,
                  "transport::mpi: MPI provides " + mpi_thread_level_name(provided) +
                      ", but gradwire's communicator calls the transport from its engine thread as well as the "
                      "caller's: initialise MPI with MPI_Init_thread(MPI_THREAD_SERIALIZED) or MPI_THREAD_MULTIPLE "
                      "(or let gradwire initialise it), and use an MPI built with thread support");
    provided_ = provided;
    return provided;
  }

  // Every MPI call of a transport holds it (see the top of this file).
  std::unique_lock<std::mutex> lock() { return std::unique_lock(mutex_); }

  // A peer was lost: MPI_Finalize would wait for it.
  void peer_lost() noexcept { lost_.store(true, std::memory_order_relaxed); }

  // Whether MPI calls may still be made (between init and finalise).
  static bool usable() noexcept {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    return initialised && !finalised;
  }

  mpi_runtime(const mpi_runtime&) = delete;
  mpi_runtime& operator=(const mpi_runtime&) = delete;

 private:
  mpi_runtime() = default;
  ~mpi_runtime() {
    if (owned_ && usable() && !lost_.load(std::memory_order_relaxed)) MPI_Finalize();
  }

  std::mutex mutex_;
  bool owned_ = false;
  int provided_ = MPI_THREAD_SINGLE;
  std::atomic<bool> lost_{false};
};

}  // namespace gradwire::transport::detail
