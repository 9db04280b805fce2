// MPI transport: tagged messages through the site's MPI (shared memory, TCP, InfiniBand: whatever its MPI was built for), deadlines everywhere.
//
// Ranks are the ranks of an MPI communicator (a duplicate of MPI_COMM_WORLD unless the
// caller gives another), so a job starts the way the site starts MPI jobs (mpirun, srun)
// and needs no rendezvous store. The communicator has MPI_ERRORS_RETURN, so MPI's errors
// become gradwire errors instead of aborting: an error on a link is errc::peer_lost.
// Tags are folded into MPI's int range (mpi/tags.hpp says why that is safe).
//
// Sends are MPI_Isend. A receive is matched with MPI_Improbe first and received with
// MPI_Imrecv only if its size is the size expected: a message of another size is taken
// into scratch memory and reported as errc::mismatch naming both ranks and both sizes.
// Posting MPI_Irecv and relying on MPI_ERR_TRUNCATE is not safe: OpenMPI 4.1 reports
// the truncation but its single-copy paths (shared memory CMA, and the TCP BTL) write
// the whole message, past the end of the receive buffer (checked with a plain C program).
// Receives are matched in the order they were posted, per peer and MPI tag, as MPI's
// own matching would; a large message still moves once, straight into place.
//
// Waiting is test-and-wait: MPI_Test until the operation completes or its deadline
// passes (errc::timeout naming the peer, the tag and the bytes), polling for
// mpi_options::poll_before_sleep (hot while support::spin_gate says it pays, else
// yielding the core on each poll, always when the ranks of this host outnumber its CPUs,
// since the rank waited for may need it: support/waiting.hpp), then sleeping between
// polls from 10 us, doubling up to max_sleep. MPI progresses only inside MPI calls, so
// the sleeps are short; an idle rank costs a few thousand polls a second, not a core.
//
// A rank that fails (fail(), or a transport destroyed while an exception unwinds) sends
// an abort message with its reason to every rank, which then fails its pending and later
// operations with that cause ("rank R failed: ..."), so every rank reports the root cause
// of, say, a collective mismatch that only two of them could see. A rank that dies is
// another matter: OpenMPI's launcher ends the whole job when a process exits without
// MPI_Finalize (its survivors are killed; mpirun exits non-zero naming the rank and the
// signal), and over shared memory MPI sees nothing else; with a launcher that lets the
// job go on, the survivors fail at their deadline (errc::timeout) or, where MPI reports
// the broken link, at once (errc::peer_lost). docs/transports.md shows both. So, unlike
// asio_tcp and ucx, the transport neither tolerates a lost peer nor says goodbye.
//
// The class is the shared facade (detail/network_facade.hpp) over mpi_engine; the engine
// lives in mpi/, one file per job: options, op, backoff (the waits' polls and sleeps),
// join, send, receive, wait, failure; runtime.hpp (MPI's initialisation, lock and errors)
// and tags.hpp. gradwire::mpi has no compiled runtime: the *.ipp are inline and included
// here in both modes (config.hpp).
#pragma once

#include <cstdint>

#include "../concepts.hpp"
#include "detail/network_facade.hpp"
#include "mpi/engine.hpp"
#include "mpi/options.hpp"
#include "mpi/failure.ipp"
#include "mpi/join.ipp"
#include "mpi/receive.ipp"
#include "mpi/send.ipp"
#include "mpi/wait.ipp"

namespace gradwire::transport {

class mpi : public detail::network_facade<detail::mpi_engine> {
 public:
  // Joins the job of `options.comm` (collective over it). Initialises MPI if nobody has.
  // While an exception unwinds, the destructor tells every rank why this one fails.
  explicit mpi(const mpi_options& options = {}) : network_facade(options) {}

  // The communicator gradwire's messages travel on (a duplicate: do not send on it).
  MPI_Comm communicator() const noexcept { return engine_->comm; }
  // Tags below this pass through unchanged (mpi/tags.hpp).
  std::uint64_t tag_limit() const noexcept { return engine_->tags.limit; }
};

static_assert(concepts::transport<mpi> && concepts::failable_transport<mpi>);
static_assert(concepts::multiplexing_transport<mpi> && concepts::metered_transport<mpi>);
static_assert(concepts::topology_aware_transport<mpi>);
// A lost rank ends an MPI job: the parameter server must not count on going on without one.
static_assert(!concepts::loss_tolerant_transport<mpi>, "mpi_engine has no tolerate(): no tolerate_loss");

}  // namespace gradwire::transport
