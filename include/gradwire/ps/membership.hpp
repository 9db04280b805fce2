// Which workers a parameter server serves: a slot each, its control receive, losses and rejoins.
//
// A worker is live from the start until it says it is done or is lost. Only a mode whose
// rule drops lost workers (step_rule<Mode>::drops_lost_workers, async modes), over a
// transport that tolerates the loss, goes on without it; any other failure of a worker's
// request is fatal. Over a transport that also links replacements (elastic: concepts::
// rejoinable_transport) a lost worker's control receive stays posted, and the first
// request of its replacement makes it live again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "protocol.hpp"
#include "stats.hpp"
#include "windows.hpp"

namespace gradwire::ps::detail {

// Rule: the server's step_rule (drops_lost_workers). `stats` and `who` are the server's:
// losses and rejoins are counted there, and messages name the server as it is named now.
template <class Rule, class V, class Tr>
class membership {
 public:
  // What the server keeps per worker.
  struct worker_slot {
    typename Tr::request control;      // posted receive of the worker's next request
    request_header header;             // ... lands here
    typename Tr::request reply_send;   // the latest reply, until it is known to be sent
    aligned_buffer<V> own_reply;       // without a window: the reply is built here
    std::span<V> reply;                // [reply header][parameters]: own_reply, or its block of the window
    std::span<const V> window_gradient;  // where its one-sided pushes land
    bool windowed = false;             // this server has a window (and the two spans above are in it)
    bool live = true;                  // neither finished nor lost
    bool lost = false;                 // lost; its control receive waits for a replacement (elastic)
    bool pull_waiting = false;
    bool pull_in_window = false;       // answer with the header only: it gets the parameters itself
    std::uint64_t pull_least = 0;      // sync modes: the least version the pull wants
    std::uint64_t clock = 0;           // gradients received (from the resumed version on)
    std::uint64_t staleness = 0;       // of its latest gradient taken (async modes), for its replies
  };

  // A lost worker's process may be restarted and rejoin (set up by agent::setup).
  static constexpr bool elastic = Rule::drops_lost_workers && concepts::rejoinable_transport<Tr>;

  // Every worker live; its replies in `window` where that was exposed, else in a buffer of
  // its own for `elements` parameters.
  membership(Tr& t, int workers, std::size_t elements, server_window<V, Tr>& window, server_stats& stats,
             const std::string& who, bool report)
      : t_(t), stats_(stats), who_(who), report_(report), slots_(static_cast<std::size_t>(workers)), active_(workers) {
    for (int w = 0; w < workers; ++w) {
      auto& s = slot(w);
      if (window.exposed()) {  // replies and one-sided pushes live in the window
        s.reply = window.reply(w);
        s.window_gradient = window.gradient(w);
        s.windowed = true;
      } else {
        s.own_reply = aligned_buffer<V>(reply_header_elements<V> + elements);
        s.reply = s.own_reply.span();
      }
    }
  }

  worker_slot& slot(int w) noexcept { return slots_[static_cast<std::size_t>(w)]; }
  const worker_slot& slot(int w) const noexcept { return slots_[static_cast<std::size_t>(w)]; }
  std::span<worker_slot> slots() noexcept { return slots_; }
  std::span<const worker_slot> slots() const noexcept { return slots_; }
  int active() const noexcept { return active_; }      // live workers
  int finished() const noexcept { return finished_; }  // workers that said done
  std::string worker_name(int w) const { return who_ + ": worker rank " + std::to_string(w); }

  // Whether the transport has lost w's process and not linked a replacement yet. A
  // receive posted from such a worker waits for the replacement (elastic), so only the
  // control receive lose() posts may be posted then; what the lost process left behind
  // is not served.
  bool link_lost(int w) const { return elastic && concepts::has_lost(t_, w); }

  // Posts w's next control receive. Returns whether a live worker was dropped instead
  // (its link was lost): the caller's rule then moves on without it (on_leave).
  [[nodiscard]] bool post_control(int w) {
    auto& s = slot(w);
    if (!s.lost && link_lost(w))  // gone before this was posted: drop it now (lose() posts again)
      return lose(w, error(errc::peer_lost, worker_name(w) + ": its connection was lost"));
    s.control = t_.async_recv(w, request_tag, writable_bytes_of(s.header));
    return false;
  }

  // A worker's request failed. Async modes over a transport that tolerates the loss drop
  // the worker and go on; anything else is fatal, and so is a peer_lost that is not this
  // worker's loss (a server lost, whose loss fails this rank's transport as a whole).
  // Elastic: its next request may come from a replacement process (take_back). Returns
  // whether a live worker was dropped (the caller's rule then moves on without it).
  [[nodiscard]] bool lose(int w, const error& e) {
    const bool tolerated = Rule::drops_lost_workers && concepts::tolerates_loss(t_);
    if (!tolerated || e.kind() != errc::peer_lost || !concepts::has_lost(t_, w)) throw e;
    auto& s = slot(w);
    const bool was_live = s.live;  // a replacement that is lost before its first request was never counted
    if (was_live) {
      s.live = false;
      --active_;
      stats_.lost_workers.push_back(w);
      observe::log(concepts::time_of(t_), report_ ? observe::log_level::warning : observe::log_level::info, t_.rank(), t_.size(),
                   "parameter server: dropped worker rank ", w, ": ", e.what());
    }
    if constexpr (elastic) {
      s.lost = true;
      s.pull_waiting = false;
      (void)post_control(w);  // lost now: it posts, and drops nobody
    }
    return was_live;
  }

  // A lost worker's replacement sent its first request: it is live again, from the
  // current version (so it does not hold the version back), with nothing pending.
  void take_back(int w) {
    auto& s = slot(w);
    s.lost = false;
    s.live = true;
    ++active_;
    s.clock = stats_.version;
    s.staleness = 0;
    s.pull_waiting = false;
    s.reply_send = {};
    stats_.rejoined_workers.push_back(w);
    observe::log(concepts::time_of(t_), report_ ? observe::log_level::warning : observe::log_level::info, t_.rank(), t_.size(),
                 "parameter server: worker rank ", w, " rejoined (a replacement process) at version ", stats_.version);
  }

  // Worker w said it is done.
  void finish(int w) {
    ++finished_;
    slot(w).live = false;
    --active_;
  }

  // Each worker's clock starts at `version`: the one the shard resumed from, or the one a
  // standby had when it took its server's shard over.
  void start_clocks_at(std::uint64_t version) {
    for (auto& s : slots_) s.clock = version;
  }

 private:
  Tr& t_;
  server_stats& stats_;
  const std::string& who_;
  const bool report_;
  std::vector<worker_slot> slots_;
  int active_;  // live workers
  int finished_ = 0;
};

}  // namespace gradwire::ps::detail
