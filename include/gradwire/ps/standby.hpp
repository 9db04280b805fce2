// A standby's side of replication: it follows its server's updates, and takes the shard over when the server is lost.
//
// replica.hpp is the server's side. A standby rank runs ps::server too: before serving it
// follows (standby::follow) its server, whose every update it applies to its own copy of the
// shard with the same factor and learning rate, and acknowledges. When the server finishes,
// so does the standby; when it is lost, the standby is promoted and serves its workers from
// the last update it applied.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../timeouts.hpp"
#include "protocol.hpp"
#include "stats.hpp"

namespace gradwire::ps::detail {

// An update as its standby gets it: the counters it changes, now (before the update) ...
inline replica_header counters(const server_stats& stats) {
  replica_header h{replica_kind::update};
  h.version = stats.version;
  h.updates = stats.updates;
  h.applied = stats.applied;
  return h;
}
// ... and after it, with the gradient's factor.
template <class V>
replica_header with_after(replica_header h, V scale, std::uint64_t version, std::uint64_t applied) {
  h.scale = static_cast<double>(scale);
  h.next_version = version;
  h.next_applied = applied;
  return h;
}

// A standby rank before it serves. `stats` and `who` are its server's (the standby renames
// itself when promoted).
template <class V, class Tr>
class standby {
 public:
  standby(Tr& t, int server_rank, std::chrono::milliseconds timeout, server_stats& stats, std::string& who)
      : t_(t), server_rank_(server_rank), timeout_(timeout), stats_(stats), who_(who) {}

  // Applies its server's updates as they come, each acknowledged, until the server
  // finishes (false) or is lost (true: this rank now serves the shard). `checksum`: its
  // shard's (the hello's); `incoming`: where an update's gradient lands;
  // apply(gradient, scale): the server's update of the shard.
  template <class Apply>
  bool follow(std::uint64_t checksum, std::span<V> incoming, Apply&& apply) {
    replica_header h;
    replica_ack ack;
    hello_server(checksum);
    try {
      typename Tr::request ack_send;
      for (;;) {
        auto header = t_.async_recv(server_rank_, replica_tag, writable_bytes_of(h));
        try {
          t_.wait(header, wait_deadline());
        } catch (const error& e) {
          if (e.kind() != errc::timeout) throw;
          throw error(errc::timeout, who_ + ": no update from server rank " + std::to_string(server_rank_) + " for " +
                                         std::to_string(timeout_.count()) + " ms; is it stopped or stuck?");
        }
        h = decode_replica_header(bytes_of(h), t_.rank(), server_rank_, stats_.version, stats_.updates,
                                  stats_.applied);
        if (h.kind == replica_kind::done) break;
        auto gradient = t_.async_recv(server_rank_, replica_gradient_tag, std::as_writable_bytes(incoming));
        t_.wait(gradient, wait_deadline());
        stats_.version = h.version;
        stats_.applied = h.applied;
        apply(incoming, static_cast<V>(h.scale));  // the same lr schedule inputs and factor as the server's
        stats_.version = h.next_version;
        stats_.replicated = stats_.applied = h.next_applied;
        if (ack_send) t_.wait(ack_send, wait_deadline());
        ack = {stats_.version, stats_.updates};
        ack_send = t_.async_send(server_rank_, replica_ack_tag, bytes_of(ack));
      }
      if (ack_send) t_.wait(ack_send, wait_deadline());
      return false;
    } catch (const error& e) {
      // Its server lost, not this rank failing (e.g. a sync worker's loss fails every rank).
      if (e.kind() != errc::peer_lost || !concepts::has_lost(t_, server_rank_)) throw;
      promote(e);
      return true;
    }
  }

 private:
  deadline wait_deadline() const { return concepts::time_of(t_).deadline_after(timeout_); }

  // A standby's half of replica_link::exchange_hello: both must start from the same
  // version and shard, or neither goes on (a standby that starts elsewhere must not take
  // over). Before the hellos, the server's loss cannot be a failover.
  void hello_server(std::uint64_t checksum) {
    const replica_hello mine{stats_.version, checksum};
    replica_hello theirs;
    try {
      auto r = t_.async_recv(server_rank_, replica_hello_tag, writable_bytes_of(theirs));
      auto sent = t_.async_send(server_rank_, replica_hello_tag, bytes_of(mine));
      t_.wait(sent, wait_deadline());
      t_.wait(r, wait_deadline());
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
      throw error(errc::peer_lost, who_ + ": server rank " + std::to_string(server_rank_) + " was lost before "
                                          "replication started (" + e.details() + "): a standby takes over only a shard "
                                          "it has confirmed; restart the job from its checkpoints");
    }
    if (theirs.version != mine.version || theirs.checksum != mine.checksum)
      throw error(errc::mismatch, who_ + " starts from version " + std::to_string(mine.version) + " (checksum " +
                                      std::to_string(mine.checksum) + "), its server rank " +
                                      std::to_string(server_rank_) + " from version " + std::to_string(theirs.version) +
                                      " (checksum " + std::to_string(theirs.checksum) + "): a server and its standby "
                                      "must resume from the same checkpoint (ps::options::checkpoint_dir on storage "
                                      "both can read)");
  }

  // The server was lost: this standby serves its shard from the last update it applied
  // (the caller starts each worker's clock there).
  void promote(const error& e) {
    stats_.promoted = true;
    stats_.promoted_at = stats_.version;
    observe::log(concepts::time_of(t_), observe::log_level::warning, t_.rank(), t_.size(), who_, ": server rank ", server_rank_, " was lost (", e.details(),
                         "); serving its shard from version ", stats_.version, " after ", stats_.updates, " updates");
    who_ = "parameter server rank " + std::to_string(t_.rank()) + " (standby of lost server rank " +
           std::to_string(server_rank_) + ")";
  }

  Tr& t_;
  const int server_rank_;
  const std::chrono::milliseconds timeout_;
  server_stats& stats_;
  std::string& who_;
};

}  // namespace gradwire::ps::detail
