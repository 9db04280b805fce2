// mpi's engine: one rank's communicator, tags and ops, declared here; each job's members are defined in its own file.
//
// join.ipp (duplicating the communicator, exchanging host names, freeing it at the end),
// send.ipp (the send path), receive.ipp (matching receives before they land), wait.ipp
// (test-and-wait, withdrawing), failure.ipp (MPI's errors, abort messages); tcp/ and ucx/
// name the same jobs the same way. What every network transport shares (making ops, wait,
// wait_any) comes from detail/network_engine.hpp; the public class is transport/mpi.hpp.
// gradwire::mpi has no compiled runtime of its own (it takes the core's mode), so the
// members are inline and mpi.hpp includes every .ipp in both modes.
//
// Unlike tcp's and ucx's, this engine neither tolerates a lost peer nor says goodbye
// (network_facade leaves tolerate_loss out, and its destructor sends no goodbye): a rank that
// dies ends an MPI job (OpenMPI's launcher), or is a timeout under --enable-recovery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../support/waiting.hpp"
#include "../../timeouts.hpp"
#include "../detail/messages.hpp"
#include "../detail/network_engine.hpp"
#include "backoff.hpp"
#include "op.hpp"
#include "options.hpp"
#include "runtime.hpp"
#include "tags.hpp"

namespace gradwire::transport::detail {

// The options, and this rank and the world size as MPI tells them at join (what the
// shared skeleton reads).
struct mpi_settings : mpi_options {
  explicit mpi_settings(const mpi_options& o) : mpi_options(o) {}
  int rank = 0;
  int size = 1;
};

struct mpi_engine : network_engine<mpi_engine, mpi_op> {
  using status = mpi_op::status;
  static constexpr const char* name = "mpi";

  explicit mpi_engine(const mpi_options& o) : options(o) {}
  ~mpi_engine();

  // --- the shared wait's hooks (wait.ipp) -------------------------------------
  struct no_watch {};
  no_watch prepare_wait(mpi_op&) noexcept { return {}; }
  bool progress(mpi_op& op, deadline until);
  template <class Find, class Done, class Request>
  bool wait_for_any(Find& find, Done& done, std::span<Request* const> requests, deadline until);
  void settled(mpi_op&) noexcept {}
  const std::string& failure_text(const mpi_op& op) const { return op.message; }

  // --- join.ipp: joining and leaving ------------------------------------------
  void join();
  void join_wait(MPI_Request& r, deadline until, const char* what);
  void exchange_hosts(deadline until);

  // --- send.ipp: the send path ------------------------------------------------
  static std::pair<int, MPI_Datatype> count_of(std::size_t bytes);
  void post_send(mpi_op& op);

  // --- receive.ipp: the receive path ------------------------------------------
  void post_recv(mpi_op& op);
  void match_receives();
  bool match(mpi_op& op);
  void unqueue(const mpi_op& op) noexcept;

  // --- wait.ipp: test-and-wait, withdrawing -----------------------------------
  bool test(mpi_op& op);
  void conclude(mpi_op& op);
  void cancel(mpi_op& op) noexcept;

  // --- failure.ipp: MPI's errors, a peer's abort, this rank's -----------------
  void fail_operation(mpi_op& op, int code);
  std::string abandoned_text(const mpi_op& op) const;
  void throw_if_abandoned(const mpi_op& op) const;
  void poll_control();
  void abort_all(errc cause, const std::string& reason);

  static std::string describe(const mpi_op& op) { return describe_operation(op.is_send, op.peer, op.tag, op.bytes); }

  mpi_settings options;
  mpi_tags tags{32767};  // MPI_TAG_UB's, learnt at join
  MPI_Comm comm = MPI_COMM_NULL;
  bool joined = false;      // the join completed: the communicator is this engine's to free
  bool dedicated = true;    // every rank of this host can have a CPU
  support::spin_gate spin;  // whether a wait's poll window is hot (support/waiting.hpp)
  bool link_lost = false;   // an MPI error on a link: the communicator is not freed
  bool failed_self = false;  // abort_all was called: aborts sent
  int failed_rank = -1;      // a peer's abort arrived
  errc failure_cause = errc::peer_lost;
  std::string failure_reason;
  std::string abort_message;  // stays while its sends may read it
  std::vector<MPI_Request> aborts;
  std::vector<mpi_op*> unmatched;  // receives whose message has not been found, in posting order
};

// The shared wait_any's hook: a template over the request type, so it is defined here, not
// in wait.ipp. Tests every pending op in turn until one completes (`find` then names it),
// a peer's abort arrives, or `until` passes.
template <class Find, class Done, class Request>
bool mpi_engine::wait_for_any(Find& find, Done&, std::span<Request* const> requests, deadline until) {
  mpi_backoff backoff(options, dedicated ? &spin : nullptr);
  for (unsigned i = 0;; ++i) {
    std::size_t live = 0;
    for (auto* r : requests) {
      if (!r || !*r) continue;
      ++live;
      // peek() is const: completing an op in place keeps its result for wait().
      if (test(const_cast<mpi_op&>(*r->peek()))) return find();
    }
    if (live == 0) throw error(errc::invalid_argument, "mpi: wait_any on no pending request");
    if (i % 64 == 0 || backoff.sleeping()) poll_control();
    if (failed_rank >= 0)
      throw error(failure_cause, peer_failed_message(options.rank, failed_rank, failure_reason));
    if (clock::now() > until) return false;
    backoff.pause();
  }
}

}  // namespace gradwire::transport::detail
