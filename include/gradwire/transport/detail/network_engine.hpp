// The part of a network transport's engine every backend shares: making ops, waiting for them, and the rank's failure.
//
// A backend's engine (tcp_engine, ucx_engine, mpi_engine) derives from
// network_engine<itself, its op> and provides, besides `options` and a static `name`:
//   post_send(op), post_recv(op), cancel(op) noexcept        its send and receive paths
//   prepare_wait(op) -> guard   before a wait sleeps (asio_tcp: polls, then tells the stall
//                               watch; the guard ends the watched wait when the wait ends)
//   progress(op, until) -> bool drives the backend until op is done; false at the deadline
//   wait_for_any(find, done, peers, until) -> bool   the same for wait_any
//   settled(op)                 the wait is over (ucx: UCX no longer tracks the op)
//   failure_text(op)            the message a failed op throws with
//   describe(op)                "send to rank 2 (tag 7, 4 bytes)", for timeouts
// and may hide check_tag(tag) (ucx reserves tags). Calls go to the backend directly
// (CRTP): nothing here is virtual.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../support/topology.hpp"
#include "../../timeouts.hpp"
#include "messages.hpp"
#include "network_op.hpp"

namespace gradwire::transport::detail {

template <class Backend, class Op>
class network_engine {
 public:
  using op_type = Op;
  using status = op_status;

  // An op for `peer`, checked; throws the rank's failure if it has failed.
  std::unique_ptr<Op> make_op(bool is_send, int peer, std::uint64_t tag, std::byte* data, std::size_t bytes) {
    const auto& o = self().options;
    check_peer(Backend::name, o.rank, peer, o.size);
    self().check_tag(tag);
    throw_if_failed();
    auto op = std::make_unique<Op>();
    op->is_send = is_send;
    op->peer = peer;
    op->tag = tag;
    op->data = data;
    op->bytes = bytes;
    return op;
  }

  // Returns once op is done, or throws: its failure, or errc::timeout at `until` (the
  // op is then withdrawn, so its buffer may go).
  void wait(Op& op, deadline until) {
    if (op.state == status::cancelled)
      throw error(errc::invalid_argument, std::string(Backend::name) + ": wait on a withdrawn request");
    [[maybe_unused]] const auto watched = self().prepare_wait(op);  // ends the watched wait when the wait ends
    if (!self().progress(op, until)) {
      self().cancel(op);
      throw error(errc::timeout, timeout_message(self().options.rank, Backend::describe(op)));
    }
    self().settled(op);
    if (op.failure != errc{}) throw error(op.failure, self().failure_text(op));
  }

  // The index of a request whose op is done (wait() on it then returns or throws at
  // once); empty requests are skipped. Throws errc::timeout when none completes by
  // `until`, and the rank's failure if it failed.
  template <class Request>
  std::size_t wait_any(std::span<Request* const> requests, deadline until) {
    std::optional<std::size_t> ready;
    auto find = [&] {
      for (std::size_t i = 0; i < requests.size() && !ready; ++i)
        if (const auto* op = requests[i] ? requests[i]->peek() : nullptr; op && op->state == status::done) ready = i;
      return ready.has_value();
    };
    auto done = [&] { return find() || failed.has_value(); };
    if (!self().wait_for_any(find, done, requests, until))
      throw error(errc::timeout, wait_any_timeout_message(self().options.rank, requests.size()));
    if (!ready) throw_if_failed();  // the wait ended because the rank failed
    return *ready;
  }

  void throw_if_failed() const {
    if (failed) throw error(failed->first, failed->second);
  }

  // Tags below tag_limit, as on every transport; a backend that reserves some hides this.
  void check_tag(std::uint64_t tag) const { detail::check_tag(Backend::name, tag); }

  cluster::topology topology;                          // learnt at join; one host until then
  std::optional<std::pair<errc, std::string>> failed;  // set once: every later call throws it
  std::vector<int> lost;                               // tolerated peers that were lost
  // Of those, the ones whose process is gone for sure: its connection closed or was reset,
  // or it sent its own abort; not a silence (heartbeats, a partition), after which it may
  // still run. An elastic job may go on without a majority only past such losses.
  std::vector<int> gone;

 private:
  Backend& self() { return static_cast<Backend&>(*this); }
  const Backend& self() const { return static_cast<const Backend&>(*this); }
};

}  // namespace gradwire::transport::detail
