// A server's link to its standby: every update the server applies, sent in order and acknowledged.
//
// Primary-backup replication of a shard (ps::options::standby). The server sends each
// update it applies, [replica_header][gradient], and the standby applies the same
// gradient with the same factor and learning rate to its copy of the shard, so the two
// stay bit for bit equal, and acknowledges it. Sync modes answer a step's pulls only once
// its update is acknowledged, so a worker never holds parameters its server's standby
// lacks: a failover loses no update. Async modes let the standby trail by at most
// options::standby_lag updates (the server waits for acknowledgements beyond that).
//
// Replication starts with the standby's hello: the version it starts from and a checksum of
// its shard, which must be the server's (a standby that resumed from another checkpoint, or
// none, would silently diverge). The gradients travel from a ring of buffers (allocated
// once; standby_lag in async modes, 1 in sync modes, where a step's pulls wait for its
// acknowledgement), each reused when its update is acknowledged. A standby that is lost
// ends replication: the server goes on alone, and says so.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../timeouts.hpp"
#include "protocol.hpp"

namespace gradwire::ps::detail {

template <class V, class Tr>
class replica_link {
 public:
  replica_link() = default;
  // `standby`: its rank; `ring`: updates it may trail by (>= 1); `version`: the server's at start.
  replica_link(Tr& t, int server, int standby, std::size_t elements, std::uint32_t ring, std::uint64_t version,
               std::chrono::milliseconds timeout)
      : t_(&t),
        server_(server),
        standby_(standby),
        timeout_(timeout),
        ring_(std::max<std::uint32_t>(ring, 1)),
        ack_message_(std::make_unique<replica_ack>()),
        acked_version_(version) {
    for (auto& slot : ring_) slot.gradient.assign(elements, V(0));
  }

  // Before the first update, server and standby exchange hellos, which must match: the
  // version each starts from and a `checksum` of its shard; errc::mismatch otherwise (on
  // both: a standby that starts elsewhere must not take over either).
  void exchange_hello(std::uint64_t version, std::uint64_t checksum) {
    replica_hello hello;
    const replica_hello mine{version, checksum};
    guarded([&] {
      auto r = t_->async_recv(standby_, replica_hello_tag, writable_bytes_of(hello));
      auto sent = t_->async_send(standby_, replica_hello_tag, bytes_of(mine));
      t_->wait(sent, concepts::time_of(*t_).deadline_after(timeout_));
      t_->wait(r, concepts::time_of(*t_).deadline_after(timeout_));
    });
    if (lost_ || (hello.version == version && hello.checksum == checksum)) return;
    throw error(errc::mismatch, "parameter server rank " + std::to_string(server_) + ": its standby rank " +
                                    std::to_string(standby_) + " starts from version " + std::to_string(hello.version) +
                                    " with other parameters (checksum " + std::to_string(hello.checksum) +
                                    "), this server from version " + std::to_string(version) + " (checksum " +
                                    std::to_string(checksum) + "): a server and its standby must resume from the "
                                    "same checkpoint (ps::options::checkpoint_dir on storage both can read)");
  }

  // Whether updates are still replicated (there is a standby and it was not lost).
  bool active() const noexcept { return t_ != nullptr && !lost_; }
  // The latest version whose update the standby acknowledged: sync modes answer pulls up to it.
  std::uint64_t acked_version() const noexcept { return acked_version_; }
  bool standby_lost() const noexcept { return lost_; }
  // Whether an acknowledgement is due (a stalled standby is what a timeout then waits for).
  bool awaiting_ack() const noexcept { return active() && acked_ < sent_; }
  // The acknowledgement receive, for the server's wait_any (nullptr when not replicating).
  typename Tr::request* ack_request() noexcept { return active() ? &ack_ : nullptr; }

  // The buffer the next update's gradient goes into (the caller fills or swaps it), free
  // once the standby trails by fewer than `lag` updates: waits for acknowledgements until then.
  std::vector<V>& next_buffer() {
    auto& slot = ring_[sent_ % ring_.size()];
    while (active() && sent_ - acked_ >= ring_.size()) take_ack(concepts::time_of(*t_).deadline_after(timeout_));
    guarded([&] {
      for (auto* r : {&slot.header_send, &slot.gradient_send})
        if (*r) t_->wait(*r, concepts::time_of(*t_).deadline_after(timeout_));
    });
    return slot.gradient;
  }

  // Sends the update whose gradient is in next_buffer(): `h` holds the server's counters
  // before and after it. The server's version stays unacknowledged until the standby says so.
  void send(const replica_header& h) {
    if (!active()) return;
    // One acknowledgement receive is posted while updates are unacknowledged.
    if (!ack_) post_ack();
    auto& slot = ring_[sent_ % ring_.size()];
    slot.header = h;
    ++sent_;
    guarded([&] {
      slot.header_send = t_->async_send(standby_, replica_tag, bytes_of(slot.header));
      slot.gradient_send = t_->async_send(standby_, replica_gradient_tag, std::as_bytes(std::span<const V>(slot.gradient)));
    });
  }

  // The acknowledgement receive completed (the server's wait_any chose it).
  void on_ack() { take_ack(concepts::time_of(*t_).deadline_after(timeout_)); }

  // The server finished: the standby ends too. Best effort within the timeout: a standby
  // that is lost or stalled now changes nothing (the server has saved its checkpoint).
  void finish() {
    try {
      while (active() && acked_ < sent_) take_ack(concepts::time_of(*t_).deadline_after(timeout_));
      if (!active()) return;  // no standby, or it was lost meanwhile
      const replica_header done{replica_kind::done};
      guarded([&] {
        auto r = t_->async_send(standby_, replica_tag, bytes_of(done));
        t_->wait(r, concepts::time_of(*t_).deadline_after(timeout_));
      });
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      observe::log(concepts::time_of(*t_), observe::log_level::warning, server_, t_->size(), "parameter server rank ", server_, ": its standby rank ", standby_,
                           " did not acknowledge the last updates (", e.details(), ")");
    }
  }

 private:
  struct slot {
    std::vector<V> gradient;
    replica_header header;
    typename Tr::request header_send, gradient_send;  // until they complete
  };

  void post_ack() {
    guarded([&] { ack_ = t_->async_recv(standby_, replica_ack_tag, writable_bytes_of(*ack_message_)); });
  }
  void take_ack(deadline until) {
    guarded([&] {
      t_->wait(ack_, until);
      const replica_ack a = decode_replica_ack(bytes_of(*ack_message_), server_, standby_, acked_, sent_,
                                               ring_[acked_ % ring_.size()].header.next_version);
      acked_ = a.updates;
      acked_version_ = a.version;
    });
    if (active() && acked_ < sent_) post_ack();  // one posted while updates are unacknowledged
  }

  // A lost standby ends replication (the server goes on without one); anything else is fatal.
  template <class F>
  void guarded(F&& f) {
    if (lost_) return;
    try {
      f();
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
      lost_ = true;
      observe::log(concepts::time_of(*t_), observe::log_level::warning, server_, t_->size(), "parameter server rank ", server_, ": lost its standby rank ", standby_,
                           " (", e.details(), "); its shard is no longer replicated");
    }
  }

  Tr* t_ = nullptr;
  int server_ = -1, standby_ = -1;
  std::chrono::milliseconds timeout_{};
  std::vector<slot> ring_;
  typename Tr::request ack_;
  std::unique_ptr<replica_ack> ack_message_;  // on the heap: the posted receive writes there, and the link may move
  std::uint64_t sent_ = 0, acked_ = 0;  // updates sent and acknowledged
  std::uint64_t acked_version_ = 0;
  bool lost_ = false;
};

}  // namespace gradwire::ps::detail
