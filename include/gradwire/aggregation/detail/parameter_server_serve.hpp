// The server side of aggregation::parameter_server: the loop that applies gradients and answers pulls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../parameter_server.hpp"

namespace gradwire::ps::detail {

// A server's shard as a checkpoint sees it: its pieces, each with its optimizer state.
template <class V, class Optimizer>
struct shard_model {
  using value_type = V;
  using optimizer_type = Optimizer;
  using state_type = typename Optimizer::template state<V>;
  std::vector<std::span<V>> tensors;
  std::vector<state_type> states;
  std::span<const std::span<V>> parameters() const noexcept { return tensors; }
  std::span<const state_type> optimizer_states() const noexcept { return states; }
  std::span<state_type> optimizer_states() noexcept { return states; }
};

template <class Request>
struct worker_slot {
  Request control;                    // posted receive of the worker's next request
  ps::detail::request_header header;  // ... lands here
  Request reply_send;                 // the latest reply, until it is known to be sent
  aligned_buffer<std::byte> own_reply;
  std::byte* reply = nullptr;         // [reply header][parameters]: own_reply, or its block of the window
  const std::byte* window_gradient = nullptr;  // where its one-sided pushes land (nullptr: no window)
  bool live = true;                   // neither finished nor lost
  bool pull_waiting = false;
  bool pull_in_window = false;        // answer with the header only: it gets the parameters itself
  std::uint64_t pull_least = 0;       // sync modes: the least version the pull wants
  std::uint64_t clock = 0;            // gradients received (from the resumed version on)
  std::uint64_t staleness = 0;        // of its latest gradient taken (async modes), for its replies
};

}  // namespace gradwire::ps::detail

namespace gradwire::aggregation {

template <class Mode>
template <class Tr, class V, class Optimizer>
ps::server_stats parameter_server<Mode>::serve(collective::communicator<Tr>& comm,
                                               std::span<const std::span<V>> params, const Optimizer& optimizer) {
  namespace d = ps::detail;
  const int n = comm.size(), me = comm.rank(), workers = first_server(n);
  if (!is_server(me, n))
    throw error(errc::invalid_argument, "parameter_server: rank " + std::to_string(me) +
                                            " is a worker: serve() is for the server ranks (the last " +
                                            std::to_string(options_.servers) + ")");
  const auto server = static_cast<std::size_t>(me - workers);
  const auto& mine = shard_pieces_[server];
  const std::size_t elements = shard_elements_[server];
  const std::string who = "parameter server rank " + std::to_string(me);
  auto& t = comm.transport();

  // The shard: views into this rank's parameter tensors, and their optimizer state.
  d::shard_model<V, Optimizer> shard;
  for (const auto& p : mine) {
    shard.tensors.emplace_back(params[p.tensor].data() + p.begin, p.size());
    shard.states.push_back(optimizer.template init<V>(p.size()));
  }
  ps::server_stats stats;
  const std::filesystem::path checkpoint =
      options_.checkpoint_dir.empty()
          ? std::filesystem::path()
          : options_.checkpoint_dir /
                ("ps-shard-" + std::to_string(server) + "-of-" + std::to_string(options_.servers) + ".ckpt");
  if (!checkpoint.empty() && std::filesystem::exists(checkpoint)) stats.resumed_from = stats.version = load_checkpoint(checkpoint, shard);
  std::uint64_t saved_at = stats.version;
  auto save = [&] {
    if (checkpoint.empty()) return;
    std::filesystem::create_directories(options_.checkpoint_dir);
    save_checkpoint(checkpoint, shard, stats.version);
    saved_at = stats.version;
  };

  // Buffers, allocated (and touched) once: gradients arrive into `incoming`; sync modes
  // sum a step's gradients in `sum`.
  std::vector<V> incoming(elements), sum(Mode::on_arrival ? 0 : elements);
  std::size_t in_step = 0;  // gradients summed into the open step
  stats.pushes.assign(static_cast<std::size_t>(workers), 0);
  stats.dropped_by.assign(static_cast<std::size_t>(workers), 0);
  std::vector<d::worker_slot<typename Tr::request>> slots(static_cast<std::size_t>(workers));
  const auto zones = layout<V>(static_cast<int>(server));
  for (int w = 0; w < workers; ++w) {
    auto& slot = slots[w];
    slot.clock = stats.version;
    if (window_) {  // share_windows() exposed it: replies and one-sided pushes live there
      slot.reply = window_memory_.data() + zones.reply(w);
      slot.window_gradient = window_memory_.data() + zones.gradient(w);
    } else {
      slot.own_reply.reserve_discard(zones.reply_bytes);
      slot.reply = slot.own_reply.data();
    }
  }
  int active = workers;
  observe::log_info(me, n, "parameter server (", Mode::name, ") for ", workers, " worker(s): shard of ", elements,
                    " elements in ", mine.size(), " piece(s)", stats.resumed_from ? ", resumed from version " : "",
                    stats.resumed_from ? std::to_string(stats.resumed_from) : std::string());
  const auto wait_deadline = [&] { return deadline_after(options_.timeout); };
  auto post_control = [&](int w) {
    slots[w].control = t.async_recv(w, d::request_tag, d::writable_bytes_of(slots[w].header));
  };

  Optimizer scheduled = optimizer;  // the servers' copy: its lr follows options_.learning_rate
  auto apply = [&](std::span<const V> gradient, V scale) {
    if (options_.learning_rate) {
      if constexpr (requires { scheduled.set_lr(1.0); })
        scheduled.set_lr(options_.learning_rate(stats.version, stats.applied));
      else
        throw error(errc::invalid_argument, "parameter_server: ps::options::learning_rate needs an optimizer with "
                                            "set_lr(double)");
    }
    auto trace = comm.trace("optimizer_step", gradient.size_bytes(), "optimizer");
    trace.arg("version", static_cast<std::int64_t>(stats.version));
    const V* g = gradient.data();
    for (std::size_t k = 0; k < mine.size(); ++k) {
      scheduled.step(shard.states[k], shard.tensors[k], std::span<const V>(g, mine[k].size()), scale);
      g += mine[k].size();
    }
    ++stats.updates;
  };
  // Async modes: the version is the slowest live worker's clock.
  auto advance_clock = [&] {
    std::uint64_t least = ~std::uint64_t{0};
    for (const auto& w : slots)
      if (w.live) least = std::min(least, w.clock);
    if (least != ~std::uint64_t{0}) stats.version = std::max(stats.version, least);
  };
  auto close_step_if_full = [&] {
    if constexpr (!Mode::on_arrival) {
      const std::size_t needed = static_cast<std::size_t>(std::max(1, active - Mode::backups));
      if (in_step == 0 || in_step < needed) return;
      apply(sum, V(1) / static_cast<V>(in_step));
      std::fill(sum.begin(), sum.end(), V(0));
      in_step = 0;
      ++stats.version;
    }
  };
  auto lose = [&](int w, const error& e) {
    if (!(Mode::on_arrival && concepts::tolerates_loss(comm.transport())) || e.kind() != errc::peer_lost) throw e;
    slots[w].live = false;
    --active;
    stats.lost_workers.push_back(w);
    observe::log(options_.report ? observe::log_level::warning : observe::log_level::info, me, n,
                 "parameter server: dropped worker rank ", w, ": ", e.what());
    if constexpr (Mode::on_arrival) advance_clock();
  };

  auto on_push = [&](int w) {
    auto trace = comm.trace("push", elements * sizeof(V), "ps.server");
    trace.arg("worker", w);
    auto& slot = slots[w];
    const d::request_header h = slot.header;
    ++stats.pushes[w];
    ++slot.clock;
    const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(incoming.data()), elements * sizeof(V));
    const bool in_window = (h.flags & d::in_window) != 0;
    if (in_window && !slot.window_gradient)
      throw error(errc::protocol, who + ": worker rank " + std::to_string(w) +
                                      " pushed into a window this server does not have");
    // A one-sided push is already here; a tagged one is received now.
    const std::span<const V> landed(reinterpret_cast<const V*>(slot.window_gradient), in_window ? elements : 0);
    stats.one_sided += in_window ? 1 : 0;
    auto receive_into = [&](std::span<std::byte> into) {
      if (in_window) return;
      auto r = t.async_recv(w, d::gradient_tag, into);
      t.wait(r, wait_deadline());
    };
    if constexpr (Mode::on_arrival) {
      receive_into(bytes);
      const std::uint64_t lag = stats.updates - std::min(stats.updates, h.updates);
      slot.staleness = stats.version - std::min(stats.version, h.version);
      d::record(stats.staleness, slot.staleness);
      d::record(stats.update_lag, lag);
      apply(in_window ? landed : std::span<const V>(incoming),
            options_.staleness_aware_lr ? V(1) / static_cast<V>(std::max<std::uint64_t>(1, lag)) : V(1));
      ++stats.applied;
      advance_clock();
    } else if (h.version < stats.version) {  // late: its step has closed without it
      receive_into(bytes);
      ++stats.dropped;
      ++stats.dropped_by[w];
    } else {
      if (in_window) {
        for (std::size_t i = 0; i < elements; ++i) sum[i] += landed[i];
      } else {
        auto r = [&] {
          if constexpr (concepts::accumulating_transport<Tr, V>)
            return t.async_recv_accumulate(w, d::gradient_tag, std::span<V>(sum));
          else
            return t.async_recv(w, d::gradient_tag, bytes);
        }();
        t.wait(r, wait_deadline());
        if constexpr (!concepts::accumulating_transport<Tr, V>)
          for (std::size_t i = 0; i < elements; ++i) sum[i] += incoming[i];
      }
      d::record(stats.staleness, 0);
      d::record(stats.update_lag, 0);
      ++stats.applied;
      ++in_step;
      close_step_if_full();
    }
  };

  auto send_reply = [&](int w) {
    auto trace = comm.trace("pull", elements * sizeof(V), "ps.server");
    trace.arg("worker", w).arg("version", static_cast<std::int64_t>(stats.version));
    auto& slot = slots[w];
    if (slot.reply_send) t.wait(slot.reply_send, wait_deadline());  // the worker took it before asking again
    d::reply_header h{stats.version, stats.updates, stats.applied, slot.staleness,
                      static_cast<std::uint32_t>(stats.lost_workers.size()),
                      stats.lost_workers.empty() ? -1 : stats.lost_workers.back()};
    std::memcpy(slot.reply, &h, sizeof h);
    V* out = reinterpret_cast<V*>(slot.reply + sizeof h);
    for (const auto& tensor : shard.tensors) out = std::copy(tensor.begin(), tensor.end(), out);
    // One-sided: the worker gets the parameters from the window after this header (and
    // asks again only once it has them, so they stay until then).
    slot.reply_send = t.async_send(w, d::reply_tag, {slot.reply, sizeof h + (slot.pull_in_window ? 0 : elements * sizeof(V))});
    slot.pull_waiting = false;
  };
  auto answer_pulls = [&] {
    for (int w = 0; w < workers; ++w) {
      auto& slot = slots[w];
      if (!slot.live || !slot.pull_waiting) continue;
      const std::uint64_t lead = slot.clock - std::min(slot.clock, stats.version);
      const bool ready = Mode::on_arrival ? (Mode::max_lead < 0 || lead <= static_cast<std::uint64_t>(Mode::max_lead))
                                          : stats.version >= slot.pull_least;
      if (!ready) continue;
      if (Mode::on_arrival) stats.max_lead = std::max(stats.max_lead, lead);
      try {
        send_reply(w);
      } catch (const error& e) {
        lose(w, e);
      }
    }
  };

  for (int w = 0; w < workers; ++w) post_control(w);
  std::vector<typename Tr::request*> pending(static_cast<std::size_t>(workers));
  while (active > 0) {
    for (int w = 0; w < workers; ++w) pending[w] = slots[w].live ? &slots[w].control : nullptr;
    std::size_t w = 0;
    try {
      w = t.wait_any(pending, wait_deadline());
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      throw error(errc::timeout, who + ": no worker sent anything for " +
                                     std::to_string(options_.timeout.count()) + " ms (" + std::to_string(active) +
                                     " still expected); are they stuck, or is the timeout too short?");
    }
    auto& slot = slots[w];
    try {
      t.wait(slot.control, wait_deadline());
      switch (slot.header.kind) {
        case d::request_kind::push:
          on_push(static_cast<int>(w));
          post_control(static_cast<int>(w));
          break;
        case d::request_kind::pull:
          if ((slot.header.flags & d::in_window) && !slot.window_gradient)
            throw error(errc::protocol, who + ": worker rank " + std::to_string(w) +
                                            " asked for a one-sided pull from a window this server does not have");
          slot.pull_waiting = true;
          slot.pull_in_window = (slot.header.flags & d::in_window) != 0;
          slot.pull_least = slot.header.version;
          post_control(static_cast<int>(w));
          break;
        case d::request_kind::done:
          slot.live = false;
          --active;
          if constexpr (Mode::on_arrival) advance_clock();
          close_step_if_full();  // the step may now have every gradient it still needs
          break;
        default:
          throw error(errc::protocol, who + ": worker rank " + std::to_string(w) + " sent an unknown request kind " +
                                          std::to_string(static_cast<std::uint32_t>(slot.header.kind)));
      }
    } catch (const error& e) {
      lose(static_cast<int>(w), e);
    }
    answer_pulls();
    if (options_.checkpoint_every > 0 && stats.version >= saved_at + options_.checkpoint_every) save();
  }
  for (auto& slot : slots)  // replies already taken by finished workers; do not cut them off
    if (slot.reply_send && !slot.live) {
      try {
        t.wait(slot.reply_send, deadline_after(std::chrono::seconds(1)));
      } catch (const error&) {
      }
    }
  save();
  observe::log_info(me, n, "parameter server done: version ", stats.version, ", ", stats.updates, " updates, ",
                    stats.applied, " gradients applied, ", stats.dropped, " dropped, ", stats.lost_workers.size(),
                    " worker(s) lost");
  return stats;
}

}  // namespace gradwire::aggregation
