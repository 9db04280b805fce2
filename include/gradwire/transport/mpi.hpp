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
// the broken link, at once (errc::peer_lost). docs/transports.md shows both.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../support/waiting.hpp"
#include "../timeouts.hpp"
#include "detail/messages.hpp"
#include "detail/pending_request.hpp"
#include "detail/failure.hpp"
#include "mpi/runtime.hpp"
#include "mpi/tags.hpp"
#include "traffic.hpp"

namespace gradwire::transport {

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

namespace detail {

struct mpi_op {
  bool is_send = false;
  int peer = 0;
  std::uint64_t tag = 0;
  int mpi_tag = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  bool matched = false;  // a receive: its message is known (MPI_Improbe) and being received
  bool wrong_size = false;    // a receive matched by a message of another size
  std::uint64_t arrived = 0;  // ... of this size
  std::vector<std::byte> discard;  // ... and where it goes
  MPI_Request request = MPI_REQUEST_NULL;
  bool complete = false;  // MPI finished it; `code` and `status` say how
  int code = MPI_SUCCESS;
  MPI_Status status{};
};

inline std::string describe(const mpi_op& op) { return describe_operation(op.is_send, op.peer, op.tag, op.bytes); }

// Polls, then sleeps between polls (see the top of mpi.hpp). The poll window is hot while
// `gate` (nullptr: not every rank here has a CPU) says it pays, else it yields.
class mpi_backoff {
 public:
  mpi_backoff(const mpi_options& o, support::spin_gate* gate)
      : options_(o), gate_(gate), hot_(gate && gate->open()), hot_until_(clock::now() + o.poll_before_sleep) {}
  mpi_backoff(const mpi_backoff&) = delete;
  mpi_backoff& operator=(const mpi_backoff&) = delete;
  ~mpi_backoff() {
    if (hot_) gate_->spun(sleep_.count() == 0 && clock::now() < hot_until_);
  }
  void pause() {
    if (sleep_.count() == 0) {
      if (clock::now() < hot_until_) {
        hot_ ? support::cpu_relax() : std::this_thread::yield();
        return;
      }
      sleep_ = std::chrono::microseconds(10);
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::max(options_.max_sleep, std::chrono::microseconds(10)));
  }
  bool sleeping() const noexcept { return sleep_.count() != 0; }

 private:
  const mpi_options& options_;
  support::spin_gate* gate_;
  bool hot_;
  deadline hot_until_;
  std::chrono::microseconds sleep_{0};
};

}  // namespace detail

class mpi {
  struct state;

 public:
  using request = detail::pending_request<state, detail::mpi_op>;

  // Joins the job of `options.comm` (collective over it). Initialises MPI if nobody has.
  explicit mpi(const mpi_options& options = {}) : state_(std::make_shared<state>(options)) {}
  mpi(mpi&&) noexcept = default;
  mpi& operator=(mpi&&) noexcept = default;
  // While an exception unwinds, tells every rank why this one fails (as ucx does).
  ~mpi() {
    if (state_ && std::uncaught_exceptions() > 0) state_->fail(errc::peer_lost, detail::unwinding_reason);
  }

  int rank() const noexcept { return state_->rank; }
  int size() const noexcept { return state_->size; }
  // The communicator gradwire's messages travel on (a duplicate: do not send on it).
  MPI_Comm communicator() const noexcept { return state_->comm; }
  // Tags below this pass through unchanged (mpi/tags.hpp).
  std::uint64_t tag_limit() const noexcept { return state_->tags.limit; }
  // Which ranks share a host, from the host names exchanged at join.
  const cluster::topology& topology() const noexcept { return state_->topology; }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    return detail::start_operation(state_, state_->make_op(true, peer, tag, bytes.size()), [&](detail::mpi_op& op) {
      state_->post_send(op, const_cast<std::byte*>(bytes.data()));
    });
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    return detail::start_operation(state_, state_->make_op(false, peer, tag, bytes.size()),
                                   [&](detail::mpi_op& op) { state_->post_recv(op, bytes.data()); });
  }
  void wait(request& r, deadline until) { detail::finish_operation(*state_, r, until, "mpi"); }

  // The index of one of `requests` (null entries skipped) that wait() finishes without blocking.
  std::size_t wait_any(std::span<request* const> requests, deadline until) { return state_->wait_any(requests, until); }

  // Marks this rank failed and tells every rank why (concepts::failable_transport).
  void fail(errc cause, const std::string& reason) { state_->fail(cause, reason); }

  // Payload this rank has sent and received (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

 private:
  struct state {
    explicit state(const mpi_options& o) : options(o), tags(32767) {
      detail::mpi_runtime::instance().ensure(o.thread_level);
      const auto until = deadline_after(o.connect_timeout);
      {
        MPI_Request r = MPI_REQUEST_NULL;
        auto lock = detail::mpi_runtime::instance().lock();
        MPI_Comm_idup(o.comm == MPI_COMM_NULL ? MPI_COMM_WORLD : o.comm, &comm, &r);
        lock.unlock();
        join_wait(r, until, "duplicating the communicator");
      }
      auto lock = detail::mpi_runtime::instance().lock();
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
      int* tag_ub = nullptr;
      int found = 0;
      MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found);
      tags = detail::mpi_tags(found && tag_ub ? *tag_ub : 32767);
      lock.unlock();
      exchange_hosts(until);
      dedicated = support::cpu_per_rank(topology.local_size(rank));
    }
    ~state() {
      if (!detail::mpi_runtime::usable()) return;
      auto lock = detail::mpi_runtime::instance().lock();
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
      if (!lost && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }

    // --- joining ---------------------------------------------------------------------

    void join_wait(MPI_Request& r, deadline until, const char* what) {
      detail::mpi_backoff backoff(options, nullptr);
      for (;;) {
        int done = 0;
        {
          auto lock = detail::mpi_runtime::instance().lock();
          const int code = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
          if (code != MPI_SUCCESS)
            throw error(detail::mpi_error_kind(code), std::string("transport::mpi: ") + what + " failed: " +
                                                          detail::mpi_error_text(code));
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
    void exchange_hosts(deadline until) {
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
      std::vector<char> all(static_cast<std::size_t>(width) * size);
      MPI_Request r = MPI_REQUEST_NULL;
      {
        auto lock = detail::mpi_runtime::instance().lock();
        MPI_Iallgather(mine.data(), width - 1, MPI_CHAR, all.data(), width - 1, MPI_CHAR, comm, &r);
      }
      join_wait(r, until, "exchanging host names");
      std::vector<std::string> hosts;
      for (int k = 0; k < size; ++k) hosts.emplace_back(all.data() + static_cast<std::size_t>(k) * (width - 1));
      topology = cluster::topology::from_identities(hosts, hosts);
    }

    // --- operations ------------------------------------------------------------------

    std::unique_ptr<detail::mpi_op> make_op(bool is_send, int peer, std::uint64_t tag, std::size_t bytes) {
      detail::check_peer("mpi", rank, peer, size);
      detail::check_tag("mpi", tag);
      auto op = std::make_unique<detail::mpi_op>();
      op->is_send = is_send;
      op->peer = peer;
      op->tag = tag;
      op->bytes = bytes;
      return op;
    }

    // MPI counts are ints: messages of 2 GiB or more travel in 4-byte units (every
    // gradwire tensor's size is a multiple of 4).
    static std::pair<int, MPI_Datatype> count_of(std::size_t bytes) {
      if (bytes <= static_cast<std::size_t>(INT_MAX)) return {static_cast<int>(bytes), MPI_BYTE};
      if (bytes % 4 == 0 && bytes / 4 <= static_cast<std::size_t>(INT_MAX))
        return {static_cast<int>(bytes / 4), MPI_INT32_T};
      throw error(errc::invalid_argument, "mpi: a message of " + std::to_string(bytes) +
                                              " bytes: above 2 GiB, sizes must be multiples of 4 and below 8 GiB");
    }

    void post_send(detail::mpi_op& op, std::byte* data) {
      throw_if_failed(op);
      const auto [count, type] = count_of(op.bytes);
      auto lock = detail::mpi_runtime::instance().lock();
      const int code = MPI_Isend(data, count, type, op.peer, tags.fold(op.tag), comm, &op.request);
      if (code != MPI_SUCCESS) {
        op.complete = true;  // nothing for MPI to withdraw
        throw failure(op, code);
      }
    }

    void post_recv(detail::mpi_op& op, std::byte* data) {
      throw_if_failed(op);
      count_of(op.bytes);  // refuses a size MPI cannot count before anything is queued
      op.data = data;
      op.mpi_tag = tags.fold(op.tag);
      unmatched.push_back(&op);
      match_receives();
    }

    // Matches the receives still waiting for their message, in the order they were
    // posted per (peer, MPI tag): a later one waits while an earlier one with the same
    // pair is unmatched, as under MPI's non-overtaking rule.
    void match_receives() {
      if (unmatched.empty()) return;
      auto lock = detail::mpi_runtime::instance().lock();
      for (std::size_t i = 0; i < unmatched.size();) {
        detail::mpi_op& op = *unmatched[i];
        const bool behind = std::any_of(unmatched.begin(), unmatched.begin() + static_cast<std::ptrdiff_t>(i),
                                        [&](const detail::mpi_op* o) { return o->peer == op.peer && o->mpi_tag == op.mpi_tag; });
        if (behind || !match(op)) {
          ++i;
          continue;
        }
        unmatched.erase(unmatched.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }

    // True once op's message is found and being received (lock held).
    bool match(detail::mpi_op& op) {
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

    void unqueue(const detail::mpi_op& op) noexcept {
      unmatched.erase(std::remove(unmatched.begin(), unmatched.end(), &op), unmatched.end());
    }

    // Completes `op` if MPI has; true once it is complete.
    bool test(detail::mpi_op& op) {
      if (op.complete) return true;
      if (!op.is_send && !op.matched) {
        match_receives();
        if (!op.matched) return false;
        if (op.complete) return true;
      }
      int done = 0;
      auto lock = detail::mpi_runtime::instance().lock();
      op.code = MPI_Test(&op.request, &done, &op.status);
      // With MPI_ERRORS_RETURN a failed operation is complete too (its request freed).
      if (op.code != MPI_SUCCESS) done = 1;
      op.complete = done != 0;
      return op.complete;
    }

    void wait(detail::mpi_op& op, deadline until) {
      detail::mpi_backoff backoff(options, dedicated ? &spin : nullptr);
      for (unsigned i = 0;; ++i) {
        if (test(op)) return finish(op);
        if (i % 64 == 0 || backoff.sleeping()) poll_control();
        throw_if_failed(op);
        if (clock::now() > until) throw error(errc::timeout, detail::timeout_message(rank, detail::describe(op)));
        backoff.pause();
      }
    }

    template <class Request>
    std::size_t wait_any(std::span<Request* const> requests, deadline until) {
      detail::mpi_backoff backoff(options, dedicated ? &spin : nullptr);
      std::size_t live = 0;
      for (unsigned i = 0;; ++i) {
        for (std::size_t k = 0; k < requests.size(); ++k) {
          if (!requests[k] || !*requests[k]) continue;
          ++live;
          // peek() is const: completing an op in place keeps its result for wait().
          if (test(const_cast<detail::mpi_op&>(*requests[k]->peek()))) return k;
        }
        if (live == 0) throw error(errc::invalid_argument, "mpi: wait_any on no pending request");
        live = 0;
        if (i % 64 == 0 || backoff.sleeping()) poll_control();
        if (failed_rank >= 0)
          throw error(failure_cause, detail::peer_failed_message(rank, failed_rank, failure_reason));
        if (clock::now() > until) throw error(errc::timeout, detail::wait_any_timeout_message(rank, requests.size()));
        backoff.pause();
      }
    }

    // Withdraws an op that will not be waited for. A receive whose message has not come
    // is simply forgotten; one whose message is arriving is let finish (a bounded wait:
    // it may be writing into the buffer). MPI cannot reliably cancel a send, so a send is
    // left to complete (MPI may still read its buffer: after a timeout the job is over,
    // and a dropped send was matched or never will be).
    void cancel(detail::mpi_op& op) noexcept {
      if (!op.is_send && !op.matched) {
        unqueue(op);
        op.complete = true;
        return;
      }
      if (op.complete || op.request == MPI_REQUEST_NULL || !detail::mpi_runtime::usable()) return;
      auto lock = detail::mpi_runtime::instance().lock();
      if (!op.is_send && !lost) {
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

    // The outcome of a completed op.
    void finish(detail::mpi_op& op) {
      if (op.code != MPI_SUCCESS) throw failure(op, op.code);
      if (op.wrong_size)
        throw error(errc::mismatch, detail::size_mismatch_message(op.peer, op.arrived, op.tag, rank, op.bytes));
    }

    error failure(const detail::mpi_op& op, int code) {
      const errc kind = detail::mpi_error_kind(code);
      if (kind == errc::peer_lost) {
        lost = true;
        detail::mpi_runtime::instance().peer_lost();
        return error(kind, "rank " + std::to_string(rank) + ": " + detail::describe(op) + " failed: lost rank " +
                               std::to_string(op.peer) + " (MPI: " + detail::mpi_error_text(code) + ")");
      }
      return error(kind, "rank " + std::to_string(rank) + ": " + detail::describe(op) + ": " + detail::mpi_error_text(code));
    }

    // --- failure ---------------------------------------------------------------------

    void throw_if_failed(const detail::mpi_op& op) const {
      if (failed_rank < 0) return;
      throw error(failure_cause, detail::abandoned_by_message(rank, detail::describe(op), failed_rank, failure_reason));
    }

    // An abort message from a failed rank: [u32 cause][reason].
    void poll_control() {
      if (failed_rank >= 0) return;
      auto lock = detail::mpi_runtime::instance().lock();
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
      failure_cause = detail::peer_failure_kind(static_cast<errc>(cause));
      failure_reason.assign(text.data() + sizeof cause, text.data() + std::max(count, 4));
    }

    void fail(errc cause, const std::string& reason) {
      if (failed_self || failed_rank >= 0 || !detail::mpi_runtime::usable()) return;
      failed_self = true;
      const auto code = static_cast<std::uint32_t>(cause);
      abort_message.resize(sizeof code);
      std::memcpy(abort_message.data(), &code, sizeof code);
      abort_message += reason;
      auto lock = detail::mpi_runtime::instance().lock();
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Isend(abort_message.data(), static_cast<int>(abort_message.size()), MPI_BYTE, r, tags.control(), comm,
                      &request) == MPI_SUCCESS)
          aborts.push_back(request);
      }
    }

    mpi_options options;
    detail::mpi_tags tags;
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1;
    bool dedicated = true;    // every rank of this host can have a CPU
    support::spin_gate spin;  // whether a wait's poll window is hot (support/waiting.hpp)
    cluster::topology topology;
    bool lost = false;         // an MPI error on a link: the communicator is not freed
    bool failed_self = false;  // fail() was called: aborts sent
    int failed_rank = -1;      // a peer's abort arrived
    errc failure_cause = errc::peer_lost;
    std::string failure_reason;
    std::string abort_message;  // stays while its sends may read it
    std::vector<MPI_Request> aborts;
    std::vector<detail::mpi_op*> unmatched;  // receives whose message has not been found, in posting order
  };

  std::shared_ptr<state> state_;
  traffic_counters traffic_;
};

static_assert(concepts::transport<mpi> && concepts::failable_transport<mpi>);
static_assert(concepts::multiplexing_transport<mpi> && concepts::metered_transport<mpi>);
static_assert(concepts::topology_aware_transport<mpi>);

}  // namespace gradwire::transport
