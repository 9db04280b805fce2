// A parameter-server mode's rule: when its server applies gradients, moves its version and answers a pull.
//
// The modes (modes.hpp) are of two kinds, one specialisation of step_rule<Mode> each:
//   on arrival (ps::async, ps::bounded_staleness<s>): each gradient is applied as it comes,
//     scaled by 1 / its update lag under options::staleness_aware_lr; the version is the
//     slowest live worker's clock; a pull waits while its worker leads the version by more
//     than max_lead. A lost worker may be dropped and the others go on.
//   per step (ps::sync, ps::backup_workers<b>): a step sums a gradient from every live
//     worker but b and applies their mean; the version counts closed steps; a gradient for
//     a closed step is dropped; a pull waits for the step it wants. A lost worker is fatal.
// The server's loop (server.hpp) is the same for both: it sizes its step's sum and its
// standby's ring from the rule, and calls on_push, on_leave, may_answer and on_answer. The
// handlers take the server (its friend) and use its stats_, options_, members_
// (membership.hpp) and replica_, the step's sum_ and in_step_, and take_gradient (through a
// codec, add_gradient too) and apply.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "../concepts.hpp"
#include "../support/always_false.hpp"
#include "protocol.hpp"
#include "standby.hpp"
#include "stats.hpp"

namespace gradwire::ps {

// Mode: concepts::ps_mode; its kind (on_arrival) chooses the specialisation.
template <class Mode, class = void>
struct step_rule {
  static_assert(support::always_false_v<Mode>,
                "ps::step_rule<Mode>: Mode does not satisfy gradwire::concepts::ps_mode: it needs static name, "
                "on_arrival, backups and max_lead (use ps::sync, ps::async, ps::bounded_staleness<s> or "
                "ps::backup_workers<b>)");
};

// Async modes: every gradient is an update.
template <class Mode>
  requires(concepts::ps_mode<Mode> && bool(Mode::on_arrival))
struct step_rule<Mode> {
  // Over a transport that tolerates it, a lost worker is dropped (its replacement may rejoin).
  static constexpr bool drops_lost_workers = true;
  // Nothing is summed.
  static constexpr std::size_t step_elements(std::size_t) noexcept { return 0; }
  // A standby may trail its server by options::standby_lag updates.
  static constexpr std::uint32_t replica_ring(std::uint32_t standby_lag) noexcept { return standby_lag; }

  // Applied at once, scaled by 1 / update lag under staleness_aware_lr, and sent to the
  // standby with the counters it moved.
  template <class Server>
  static void on_push(Server& s, int w, const detail::request_header& h, bool in_window) {
    using V = typename Server::value_type;
    auto& stats = s.stats_;
    auto& slot = s.members_.slot(w);
    const std::span<const V> gradient = s.take_gradient(w, in_window);
    const std::uint64_t lag = stats.updates - std::min(stats.updates, h.updates);
    slot.staleness = stats.version - std::min(stats.version, h.version);
    detail::record(stats.staleness, slot.staleness);
    detail::record(stats.update_lag, lag);
    const V scale = s.options_.staleness_aware_lr ? V(1) / static_cast<V>(std::max<std::uint64_t>(1, lag)) : V(1);
    const auto before = detail::counters(stats);
    s.apply(gradient, scale);
    ++stats.applied;
    advance_clock(s);
    if (s.replica_.active()) {
      std::ranges::copy(gradient, s.replica_.next_buffer().begin());
      s.replica_.send(detail::with_after(before, scale, stats.version, stats.applied));
    }
  }

  // A worker finished or was dropped: the slowest of the others may be ahead of it.
  template <class Server>
  static void on_leave(Server& s) {
    advance_clock(s);
  }

  // Once the worker is at most max_lead ahead of the slowest (always, for async).
  template <class Server, class Slot>
  static bool may_answer(const Server& s, const Slot& slot) {
    const std::uint64_t lead = lead_of(slot, s.stats_.version);
    return Mode::max_lead < 0 || lead <= static_cast<std::uint64_t>(Mode::max_lead);
  }
  template <class Slot>
  static void on_answer(server_stats& stats, const Slot& slot) {
    stats.max_lead = std::max(stats.max_lead, lead_of(slot, stats.version));
  }

 private:
  template <class Slot>
  static std::uint64_t lead_of(const Slot& slot, std::uint64_t version) {
    return slot.clock - std::min(slot.clock, version);
  }

  // The version is the slowest live worker's clock (it never goes back).
  template <class Server>
  static void advance_clock(Server& s) {
    std::uint64_t least = ~std::uint64_t{0};
    for (const auto& slot : s.members_.slots())
      if (slot.live) least = std::min(least, slot.clock);
    if (least != ~std::uint64_t{0}) s.stats_.version = std::max(s.stats_.version, least);
  }
};

// Sync modes: a step's gradients make one update.
template <class Mode>
  requires(concepts::ps_mode<Mode> && !bool(Mode::on_arrival))
struct step_rule<Mode> {
  // A worker's loss ends the job: a step would wait for its gradient.
  static constexpr bool drops_lost_workers = false;
  // The open step's sum.
  static constexpr std::size_t step_elements(std::size_t elements) noexcept { return elements; }
  // A step's pulls wait for its acknowledgement, so one update is in flight at most.
  static constexpr std::uint32_t replica_ring(std::uint32_t) noexcept { return 1; }

  template <class Server>
  static void on_push(Server& s, int w, const detail::request_header& h, bool in_window) {
    if (h.version < s.stats_.version)  // late: its step has closed without it
      drop_late(s, w, in_window);
    else
      add_to_step(s, w, in_window);
  }

  // The step may now have every gradient it still needs.
  template <class Server>
  static void on_leave(Server& s) {
    close_step_if_full(s);
  }

  // Once the step it wants has closed, and, with a standby, once that has the current
  // version: no worker holds parameters its server's standby lacks.
  template <class Server, class Slot>
  static bool may_answer(const Server& s, const Slot& slot) {
    const auto version = s.stats_.version;
    return version >= slot.pull_least && (!s.replica_.active() || s.replica_.acked_version() >= version);
  }
  template <class Slot>
  static void on_answer(server_stats&, const Slot&) {}  // no worker leads: each waits for the step

 private:
  // A gradient for a step that has closed is taken off the wire and counted. A standby
  // that took over counts apart the gradients resent for a step it had from its server.
  template <class Server>
  static void drop_late(Server& s, int w, bool in_window) {
    auto& stats = s.stats_;
    s.take_gradient(w, in_window);
    if (stats.promoted && s.members_.slot(w).header.version < stats.promoted_at) {
      ++stats.resent;
      return;
    }
    ++stats.dropped;
    ++stats.dropped_by[static_cast<std::size_t>(w)];
  }

  // Summed into the open step (received and added in one pass where the transport can;
  // through a codec, decoded and added in one pass), which closes once full.
  template <class Server>
  static void add_to_step(Server& s, int w, bool in_window) {
    using V = typename Server::value_type;
    auto& sum = s.sum_;
    if constexpr (Server::compressed) {
      s.add_gradient(w, in_window, std::span<V>(sum));
    } else if (in_window) {
      const auto gradient = s.members_.slot(w).window_gradient;
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += gradient[i];
    } else if constexpr (concepts::accumulating_transport<typename Server::transport_type, V>) {
      auto r = s.t_.async_recv_accumulate(w, detail::gradient_tag, std::span<V>(sum));
      s.t_.wait(r, s.wait_deadline());
    } else {
      const std::span<const V> gradient = s.take_gradient(w, in_window);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += gradient[i];
    }
    detail::record(s.stats_.staleness, 0);
    detail::record(s.stats_.update_lag, 0);
    ++s.stats_.applied;
    ++s.in_step_;
    close_step_if_full(s);
  }

  // A step with a gradient from every live worker (but the backups) applies their mean
  // and closes.
  template <class Server>
  static void close_step_if_full(Server& s) {
    using V = typename Server::value_type;
    auto& stats = s.stats_;
    const auto needed = static_cast<std::size_t>(std::max(1, s.members_.active() - Mode::backups));
    if (s.in_step_ == 0 || s.in_step_ < needed) return;
    const V scale = V(1) / static_cast<V>(s.in_step_);
    if (s.replica_.active()) {
      // The step's sum goes to the standby first, so that it applies the update while this
      // server does (the step's pulls wait for its acknowledgement); the buffer it leaves
      // is the next step's sum.
      auto& step_sum = s.replica_.next_buffer();
      std::swap(s.sum_, step_sum);
      s.replica_.send(detail::with_after(detail::counters(stats), scale, stats.version + 1, stats.applied));
      s.apply(step_sum, scale);
    } else {
      s.apply(s.sum_, scale);
    }
    s.in_step_ = 0;
    ++stats.version;
    std::fill(s.sum_.begin(), s.sum_.end(), V(0));
  }
};

}  // namespace gradwire::ps
