// A rank's handle for collectives: its transport, the operation sequence, timeouts and reusable scratch.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "../concepts.hpp"
#include "../observe/log.hpp"
#include "../observe/timeline.hpp"
#include "../observe/type_name.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../timeouts.hpp"
#include "async_engine.hpp"

namespace gradwire::collective {

struct communicator_options {
  // Deadline of every blocking step of a collective (default: gradwire::default_timeout,
  // or GRADWIRE_STEP_TIMEOUT seconds when set: see gradwire::step_timeout()).
  std::chrono::milliseconds timeout = default_timeout;
  // Check that all ranks entered the same collective with the same count and dtype
  // (small descriptor frames beside each call's first data, no round trip: verify.hpp).
  bool verify = true;
  // all_reduce<auto_> runs the one-shot exchange (one round: every rank sends its buffer
  // to every other, one_shot_all_reduce.hpp) over at most one_shot_max_ranks ranks on one
  // host while the N - 1 copies a rank sends come to at most this many bytes (2 ranks:
  // buffers up to 64 KiB, 4 ranks: up to 21 KiB); across hosts, only buffers that fit in
  // the call check's frame (64 B). The one place this number lives; every rank must use
  // the same value. Measured on the quiet 2-core VM (benchmarks/allreduce.sh, asio_tcp,
  // 2 ranks, one-shot against halving-doubling): 256 B 17.5 against 27.8 us, 4 KiB 18.8
  // against 28.0, 16 KiB 21.2 against 29.9, 64 KiB 36.7 against 37.8; ucx shared memory,
  // 4 ranks (load 6.5): 1 KiB 47 -> 24 us, 4 KiB 49 -> 33, 16 KiB 59 -> 49, and 64 KiB
  // 101 -> 155, where it stops paying (docs/perf/ucx_sm.md).
  std::size_t one_shot_max_sent_bytes = 64 * 1024;
  // Otherwise recursive halving-doubling (2 log2 N latency-bound steps)
  // for buffers smaller than this, and the ring (2(N-1) steps, bandwidth-optimal) from
  // this size on. The one place this number lives; every rank must use the same value
  // (the call check names a rank that does not). Measured on inproc, 2-core VM, 3-5
  // ranks (allreduce_inproc --algorithm, see benchmarks/README.md): halving-doubling
  // wins by 10-35% below 64 KiB, the ring from 128-256 KiB on. Re-measure per transport.
  std::size_t small_all_reduce_bytes = 128 * 1024;
  // all_reduce<auto_> runs the hierarchical all-reduce (hierarchical_all_reduce.hpp) from
  // this size on when the ranks span two or more hosts and some host has two or more
  // (cluster::topology::spans_hosts_with_shared_host); below it, the flat choices above.
  // The one place this number lives; every rank must use the same value. Measured by
  // benchmarks/cluster.sh (emulated hosts, 2-core VM, asio_tcp; benchmarks/README.md): at
  // 1 Gbit/s hierarchical beats ring and halving-doubling at every size from 64 B (2x2)
  // and from 64 KiB (2x4), and at 64 KiB it is 1.23-1.36x the best flat one on 2x4; at
  // 10 Gbit/s, where 2 cores rather than the link set the pace, from 256 KiB (2x4) and
  // 1 MiB (2x2). 64 KiB suits links of 1 Gbit/s class; re-measure for faster networks.
  std::size_t hierarchical_min_bytes = 64 * 1024;
};

// Every rank must call collectives in the same order: each call takes the next
// sequence number, and the sequence number is part of every message tag, so messages
// of different operations can never be confused.
template <class Transport>
class communicator {
  static_assert(concepts::transport<Transport>,
                "gradwire::collective::communicator<Transport>: Transport does not satisfy gradwire::concepts::transport "
                "(needs rank(), size(), async_send, async_recv, wait and a nested request type; see concepts.hpp)");

 public:
  using transport_type = Transport;

  explicit communicator(Transport t, communicator_options options = {})
      : transport_(std::move(t)), options_(options), topology_(topology_of(transport_)) {
    // GRADWIRE_STEP_TIMEOUT sets the deadline where the options leave the default.
    if (options_.timeout == default_timeout) options_.timeout = step_timeout();
    if (options_.timeout.count() <= 0)
      throw error(errc::invalid_argument, "communicator_options::timeout = " + std::to_string(options_.timeout.count()) +
                                              " ms: the deadline of each step of a collective must be positive");
    observe::timeline::global().add_rank(rank(), size());
    if (observe::log_enabled(observe::log_level::info)) {
      observe::log(time(), observe::log_level::info, rank(), size(), "communicator over ", observe::type_name<Transport>(), " (timeout ",
                        options_.timeout.count(), " ms, call checks ", options_.verify ? "on" : "off", ")");
      observe::log(time(), observe::log_level::info, rank(), size(), "topology: ", topology_.to_string(), "; this rank is local rank ",
                        local_rank(), " of ", local_size(), " on host ", host_index());
    }
  }
  // Move-only: a copy would reuse this one's sequence numbers (and so its message tags)
  // on the same connections, and a strategy copied with it would update the original's
  // parameters through spans into them.
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  // Moving stops the background thread first (it refers to this object); it runs what
  // was queued, so no operation is lost.
  communicator(communicator&& other) noexcept
      : transport_((other.engine_.reset(), std::move(other.transport_))),
        options_(other.options_),
        topology_(std::move(other.topology_)),
        sequence_(other.sequence_),
        scratch_(std::move(other.scratch_)) {}
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      engine_.reset();
      other.engine_.reset();
      transport_ = std::move(other.transport_);
      options_ = other.options_;
      topology_ = std::move(other.topology_);
      sequence_ = other.sequence_;
      scratch_ = std::move(other.scratch_);
    }
    return *this;
  }
  ~communicator() = default;

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  Transport& transport() noexcept { return transport_; }
  const Transport& transport() const noexcept { return transport_; }
  const communicator_options& options() const noexcept { return options_; }

  // Which ranks share a host: the transport's (concepts::topology_aware_transport), read
  // once at construction, or one host when the transport cannot tell.
  const cluster::topology& topology() const noexcept { return topology_; }
  int host_index() const { return topology_.host(rank()); }
  int host_count() const noexcept { return topology_.host_count(); }
  int local_rank() const { return topology_.local_rank(rank()); }
  int local_size() const { return topology_.local_size(rank()); }

  // The time this rank runs on (clock.hpp): its transport's (a simulated rank's virtual
  // time), or the steady clock.
  time_source time() const { return concepts::time_of(transport_); }

  // Deadline for one blocking step started now.
  deadline step_deadline() const { return time().deadline_after(options_.timeout); }
  // Deadline for waiting on a collective queued on the async engine. The collective's own
  // waits time out at step_deadline() with words that name the peer, tag and size; this
  // wait only bounds one that never runs, so it allows one more step timeout and lets the
  // collective's own error arrive first.
  deadline queued_collective_deadline() const { return time().deadline_after(2 * options_.timeout); }

  // Times an operation of this rank for GRADWIRE_TIMELINE and GRADWIRE_LOG=debug
  // (observe/timeline.hpp); `name` and `category` must be string literals.
  observe::trace_scope trace(const char* name, std::uint64_t bytes = 0, const char* category = "collective") const {
    return observe::trace_scope(time(), rank(), size(), name, category, bytes);
  }

  // Starts an operation: returns its sequence number (also named in stall reports).
  std::uint64_t begin_operation() noexcept { return observe::current_activity().operation = ++sequence_; }

  // This communicator's background thread for non-blocking collectives (async_engine.hpp),
  // started on first use. While anything is queued on it, only it may use the communicator.
  async_engine<Transport>& async() {
    if (!engine_) engine_ = std::make_unique<async_engine<Transport>>(*this);
    return *engine_;
  }

  // Scratch memory that lives as long as the communicator: grown (and pre-faulted) once,
  // then reused, so no collective allocates on the hot path.
  template <class V>
  std::span<V> scratch(std::size_t count) {
    scratch_.reserve_discard(count * sizeof(V));
    return {reinterpret_cast<V*>(scratch_.data()), count};
  }

 private:
  static cluster::topology topology_of(const Transport& t) {
    if constexpr (concepts::topology_aware_transport<Transport>) {
      cluster::topology topology = t.topology();
      if (topology.size() != t.size())
        throw error(errc::config, "communicator: the transport's topology has " + std::to_string(topology.size()) +
                                      " ranks but the job has " + std::to_string(t.size()));
      return topology;
    } else {
      return cluster::topology::one_host(t.size());
    }
  }

  Transport transport_;
  communicator_options options_;
  cluster::topology topology_;
  std::uint64_t sequence_ = 0;
  aligned_buffer<std::byte> scratch_;
  // Last, so destroyed first: its thread stops while everything it uses is still here.
  std::unique_ptr<async_engine<Transport>> engine_;
};

// A message tag: the operation's sequence number and the step within it.
inline constexpr std::uint64_t make_tag(std::uint64_t sequence, std::uint32_t step) noexcept {
  return (sequence << 16) | step;
}

}  // namespace gradwire::collective
