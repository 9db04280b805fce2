// The server side of a parameter server: the loop that takes pushes, applies updates and answers pulls.
//
// A server owns its shard's values and optimizer state. It waits for whichever worker
// speaks next (concepts::multiplexing_transport), handles that request (on_push, on_pull,
// on_done), answers the pulls the mode now allows (answer_pulls), and checkpoints when
// due, until every worker has finished or was lost. Sync modes sum a step's gradients and
// apply their mean when the step is full (close_step_if_full); async modes apply each on
// arrival and record its staleness and update lag.
//
// With standbys (options::standby), a server sends every update it applies to its standby
// (replica.hpp), and a standby rank runs the same class: it follows its server's updates
// (follow) until the server finishes, or takes the shard over when it is lost (promote)
// and then serves the workers as its server did.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "../checkpoint.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../timeouts.hpp"
#include "options.hpp"
#include "protocol.hpp"
#include "replica.hpp"
#include "sharding.hpp"
#include "stats.hpp"
#include "windows.hpp"

namespace gradwire::ps {

namespace detail {
// A server's shard as a checkpoint sees it (concepts::checkpoint_model): its pieces, each
// with its optimizer state, and the optimizer that steps them.
template <class V, class Optimizer>
struct shard_model {
  using value_type = V;
  using optimizer_type = Optimizer;
  using state_type = typename Optimizer::template state<V>;
  Optimizer scheduled;  // the server's copy: its lr follows options::learning_rate
  std::vector<std::span<V>> tensors;
  std::vector<state_type> states;
  std::span<const std::span<V>> parameters() const noexcept { return tensors; }
  std::span<const state_type> optimizer_states() const noexcept { return states; }
  std::span<state_type> optimizer_states() noexcept { return states; }
  const Optimizer& optimizer() const noexcept { return scheduled; }
};
}  // namespace detail

// Mode: concepts::ps_mode; V: the parameters' value type; Tr: a multiplexing transport;
// Optimizer: concepts::optimizer for V (with set_lr(double) if options::learning_rate is set).
template <concepts::ps_mode Mode, class V, class Tr, class Optimizer>
class server {
 public:
  using communicator_type = collective::communicator<Tr>;

  // `params`: this rank's parameter tensors (the shard is a view into them, so they hold
  // the final values when run() returns); `window`: what setup exposed (may be none).
  server(communicator_type& comm, std::span<const std::span<V>> params, const Optimizer& optimizer,
         const options& o, const sharding& shards, server_window<V, Tr>& window)
      : comm_(comm),
        t_(comm.transport()),
        options_(o),
        index_((comm.rank() - (comm.size() - o.serving_ranks())) % o.servers),
        workers_(comm.size() - o.serving_ranks()),
        server_rank_(workers_ + index_),
        is_standby_(o.standby && comm.rank() != server_rank_),
        pieces_(shards.shard(index_)),
        elements_(shards.elements(index_)),
        who_(std::string(is_standby_ ? "parameter server standby rank " : "parameter server rank ") +
             std::to_string(comm.rank())),
        shard_{optimizer, {}, {}},
        incoming_(elements_),
        sum_(Mode::on_arrival ? 0 : elements_),
        slots_(static_cast<std::size_t>(workers_)),
        pending_(static_cast<std::size_t>(workers_) + 1),
        active_(workers_) {
    for (const auto& p : pieces_) {
      shard_.tensors.emplace_back(params[p.tensor].data() + p.begin, p.size());
      shard_.states.push_back(optimizer.template init<V>(p.size()));
    }
    if (!options_.checkpoint_dir.empty())
      checkpoint_ = options_.checkpoint_dir / ("ps-shard-" + std::to_string(index_) + "-of-" +
                                               std::to_string(options_.servers) + ".ckpt");
    if (!checkpoint_.empty() && std::filesystem::exists(checkpoint_))
      stats_.resumed_from = stats_.version = load_checkpoint(checkpoint_, shard_);
    saved_at_ = stats_.version;
    if (o.standby && !is_standby_)
      replica_ = detail::replica_link<V, Tr>(t_, server_rank_, server_rank_ + o.servers, elements_,
                                             Mode::on_arrival ? o.standby_lag : 1, stats_.version, o.timeout);
    stats_.pushes.assign(static_cast<std::size_t>(workers_), 0);
    stats_.dropped_by.assign(static_cast<std::size_t>(workers_), 0);
    for (int w = 0; w < workers_; ++w) {
      auto& slot = slot_of(w);
      slot.clock = stats_.version;
      if (window.exposed()) {  // replies and one-sided pushes live in the window
        slot.reply = window.reply(w);
        slot.window_gradient = window.gradient(w);
        slot.windowed = true;
      } else {
        slot.own_reply = aligned_buffer<V>(detail::reply_header_elements<V> + elements_);
        slot.reply = slot.own_reply.span();
      }
    }
  }

  // Serves until every worker has finished or was lost; then writes the final checkpoint
  // and returns what it saw.
  server_stats run() {
    if (is_standby_ && !follow()) return stats_;  // its server finished: so has the standby
    if (replica_.active()) replica_.exchange_hello(stats_.version, shard_checksum());
    observe::log_info(comm_.rank(), comm_.size(), "parameter server (", Mode::name, ") for ", workers_,
                      " worker(s): shard of ", elements_, " elements in ", pieces_.size(), " piece(s)",
                      stats_.resumed_from ? ", resumed from version " : "",
                      stats_.resumed_from ? std::to_string(stats_.resumed_from) : std::string());
    for (int w = 0; w < workers_; ++w) post_control(w);
    while (active_ > 0) {
      const int w = next_request();
      if (w == workers_) {
        replica_.on_ack();
        answer_pulls();
        continue;
      }
      try {
        on_request(w);
      } catch (const error& e) {
        lose(w, e);
      }
      answer_pulls();
      if (options_.checkpoint_every > 0 && stats_.version >= saved_at_ + options_.checkpoint_every) save();
    }
    drain_replies();
    if (keeps_its_checkpoint()) save();
    replica_.finish();
    stats_.standby_lost = replica_.standby_lost();
    observe::log_info(comm_.rank(), comm_.size(), "parameter server done: version ", stats_.version, ", ",
                      stats_.updates, " updates, ", stats_.applied, " gradients applied, ", stats_.dropped,
                      " dropped, ", stats_.lost_workers.size(), " worker loss(es), ", stats_.rejoined_workers.size(),
                      " rejoin(s)");
    return stats_;
  }

 private:
  // What the server keeps per worker.
  struct worker_slot {
    typename Tr::request control;      // posted receive of the worker's next request
    detail::request_header header;     // ... lands here
    typename Tr::request reply_send;   // the latest reply, until it is known to be sent
    aligned_buffer<V> own_reply;       // without a window: the reply is built here
    std::span<V> reply;                // [reply header][parameters]: own_reply, or its block of the window
    std::span<const V> window_gradient;  // where its one-sided pushes land
    bool windowed = false;             // this server has a window (and the two spans above are in it)
    bool live = true;                  // neither finished nor lost
    bool lost = false;                 // lost; its control receive waits for a replacement (elastic_)
    bool pull_waiting = false;
    bool pull_in_window = false;       // answer with the header only: it gets the parameters itself
    std::uint64_t pull_least = 0;      // sync modes: the least version the pull wants
    std::uint64_t clock = 0;           // gradients received (from the resumed version on)
    std::uint64_t staleness = 0;       // of its latest gradient taken (async modes), for its replies
  };

  worker_slot& slot_of(int w) noexcept { return slots_[static_cast<std::size_t>(w)]; }

  // Async modes over a transport that takes replacements back (concepts::rejoinable_transport,
  // set up by agent::setup): a lost worker's process may be restarted and rejoin.
  static constexpr bool elastic_ = Mode::on_arrival && concepts::rejoinable_transport<Tr>;
  // Whether the transport has lost w's process and not linked a replacement yet. A
  // receive posted from such a worker waits for the replacement (elastic_), so only the
  // control receive lose() posts may be posted then; what the lost process left behind
  // is not served.
  bool link_lost(int w) const {
    if constexpr (elastic_) {
      const auto lost = t_.lost_peers();
      return std::find(lost.begin(), lost.end(), w) != lost.end();
    } else {
      return false;
    }
  }
  deadline wait_deadline() const { return deadline_after(options_.timeout); }
  std::string worker_name(int w) const { return who_ + ": worker rank " + std::to_string(w); }

  void post_control(int w) {
    auto& slot = slot_of(w);
    if (!slot.lost && link_lost(w))  // gone before this was posted: drop it now (lose() posts again)
      return lose(w, error(errc::peer_lost, worker_name(w) + ": its connection was lost"));
    slot.control = t_.async_recv(w, detail::request_tag, detail::writable_bytes_of(slot.header));
  }

  // The worker whose request arrived first; workers_ for the standby's acknowledgement.
  int next_request() {
    for (int w = 0; w < workers_; ++w)
      pending_[static_cast<std::size_t>(w)] = slot_of(w).live || slot_of(w).lost ? &slot_of(w).control : nullptr;
    pending_[static_cast<std::size_t>(workers_)] = replica_.ack_request();
    try {
      return static_cast<int>(t_.wait_any(pending_, wait_deadline()));
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      if (replica_.awaiting_ack())
        throw error(errc::timeout, who_ + ": its standby rank " + std::to_string(server_rank_ + options_.servers) +
                                       " acknowledged no update for " + std::to_string(options_.timeout.count()) +
                                       " ms (the step's pulls wait for it); is it stopped or stuck?");
      throw error(errc::timeout, who_ + ": no worker sent anything for " + std::to_string(options_.timeout.count()) +
                                     " ms (" + std::to_string(active_) +
                                     " still expected); are they stuck, or is the timeout too short?");
    }
  }

  void on_request(int w) {
    auto& slot = slot_of(w);
    t_.wait(slot.control, wait_deadline());
    slot.header = detail::decode_request(detail::bytes_of(slot.header), comm_.rank(), w, stats_.version, stats_.updates);
    if (link_lost(w)) {  // a request the lost process left behind
      if (slot.lost) return post_control(w);  // keep waiting for its replacement
      if (slot.header.kind != detail::request_kind::done)
        throw error(errc::peer_lost, worker_name(w) + ": its connection was lost before its request was served");
    }
    if (slot.lost) take_back(w);
    switch (slot.header.kind) {
      case detail::request_kind::push:
        served_since_promotion_ = true;
        on_push(w);
        post_control(w);
        break;
      case detail::request_kind::pull:
        served_since_promotion_ = true;
        on_pull(w);
        post_control(w);
        break;
      case detail::request_kind::done:
        on_done(w);
        break;
      default:
        throw error(errc::protocol, worker_name(w) + " sent an unknown request kind " +
                                        std::to_string(static_cast<std::uint32_t>(slot.header.kind)));
    }
  }

  void on_push(int w) {
    auto trace = comm_.trace("push", elements_ * sizeof(V), "ps.server");
    trace.arg("worker", w);
    auto& slot = slot_of(w);
    const detail::request_header h = slot.header;
    const bool in_window = (h.flags & detail::in_window) != 0;
    if (in_window && !slot.windowed)
      throw error(errc::protocol, worker_name(w) + " pushed into a window this server does not have");
    ++slot.clock;
    if constexpr (Mode::on_arrival)
      apply_on_arrival(w, h, in_window);
    else if (h.version < stats_.version)  // late: its step has closed without it
      drop_late(w, in_window);
    else
      add_to_step(w, in_window);
    // Counted once its gradient has arrived: a worker killed mid-push sent none, and
    // applied + dropped == pushes holds through losses.
    ++stats_.pushes[static_cast<std::size_t>(w)];
    stats_.one_sided += in_window ? 1 : 0;
  }

  // A tagged push's gradient, received now (a one-sided one is already in the window).
  void receive_gradient(int w, std::span<V> into) { receive_from(w, detail::gradient_tag, into); }
  void receive_from(int rank, std::uint64_t tag, std::span<V> into) {
    auto r = t_.async_recv(rank, tag, std::as_writable_bytes(into));
    t_.wait(r, wait_deadline());
  }

  // Async modes: applied at once, scaled by 1 / update lag under staleness_aware_lr.
  void apply_on_arrival(int w, const detail::request_header& h, bool in_window) {
    auto& slot = slot_of(w);
    if (!in_window) receive_gradient(w, incoming_);
    const std::uint64_t lag = stats_.updates - std::min(stats_.updates, h.updates);
    slot.staleness = stats_.version - std::min(stats_.version, h.version);
    detail::record(stats_.staleness, slot.staleness);
    detail::record(stats_.update_lag, lag);
    const std::span<const V> gradient = in_window ? slot.window_gradient : std::span<const V>(incoming_);
    const V scale = options_.staleness_aware_lr ? V(1) / static_cast<V>(std::max<std::uint64_t>(1, lag)) : V(1);
    const auto before = counters();
    apply(gradient, scale);
    ++stats_.applied;
    advance_clock();
    if (replica_.active()) {
      std::ranges::copy(gradient, replica_.next_buffer().begin());
      replica_.send(with_after(before, scale, stats_.version, stats_.applied));
    }
  }

  // Sync modes: a gradient for a step that has closed is taken off the wire and counted.
  // A standby that took over counts apart the gradients resent for a step it had from its server.
  void drop_late(int w, bool in_window) {
    if (!in_window) receive_gradient(w, incoming_);
    if (stats_.promoted && slot_of(w).header.version < stats_.promoted_at) {
      ++stats_.resent;
      return;
    }
    ++stats_.dropped;
    ++stats_.dropped_by[static_cast<std::size_t>(w)];
  }

  // Sync modes: summed into the open step (received and added in one pass where the
  // transport can), which closes once full.
  void add_to_step(int w, bool in_window) {
    auto& slot = slot_of(w);
    if (in_window) {
      for (std::size_t i = 0; i < elements_; ++i) sum_[i] += slot.window_gradient[i];
    } else if constexpr (concepts::accumulating_transport<Tr, V>) {
      auto r = t_.async_recv_accumulate(w, detail::gradient_tag, std::span<V>(sum_));
      t_.wait(r, wait_deadline());
    } else {
      receive_gradient(w, incoming_);
      for (std::size_t i = 0; i < elements_; ++i) sum_[i] += incoming_[i];
    }
    detail::record(stats_.staleness, 0);
    detail::record(stats_.update_lag, 0);
    ++stats_.applied;
    ++in_step_;
    close_step_if_full();
  }

  void on_pull(int w) {
    auto& slot = slot_of(w);
    const bool in_window = (slot.header.flags & detail::in_window) != 0;
    if (in_window && !slot.windowed)
      throw error(errc::protocol, worker_name(w) + " asked for a one-sided pull from a window this server does not have");
    slot.pull_waiting = true;
    slot.pull_in_window = in_window;
    slot.pull_least = slot.header.version;
  }

  void on_done(int w) {
    ++finished_;
    slot_of(w).live = false;
    --active_;
    if constexpr (Mode::on_arrival) advance_clock();
    close_step_if_full();  // the step may now have every gradient it still needs
  }

  // Runs the optimizer over the shard with `gradient` (the shard's pieces, in order) * scale.
  void apply(std::span<const V> gradient, V scale) {
    if (options_.learning_rate) {
      if constexpr (requires { shard_.scheduled.set_lr(1.0); })
        shard_.scheduled.set_lr(options_.learning_rate(stats_.version, stats_.applied));
      else
        throw error(errc::invalid_argument,
                    "parameter_server: ps::options::learning_rate needs an optimizer with set_lr(double)");
    }
    auto trace = comm_.trace("optimizer_step", gradient.size_bytes(), "optimizer");
    trace.arg("version", static_cast<std::int64_t>(stats_.version));
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      shard_.scheduled.step(shard_.states[k], shard_.tensors[k], gradient.first(pieces_[k].size()), scale);
      gradient = gradient.subspan(pieces_[k].size());
    }
    ++stats_.updates;
  }

  // Async modes: the version is the slowest live worker's clock.
  void advance_clock() {
    std::uint64_t least = ~std::uint64_t{0};
    for (const auto& slot : slots_)
      if (slot.live) least = std::min(least, slot.clock);
    if (least != ~std::uint64_t{0}) stats_.version = std::max(stats_.version, least);
  }

  // Sync modes: a step with a gradient from every live worker (but the backups) applies
  // their mean and closes.
  void close_step_if_full() {
    if constexpr (!Mode::on_arrival) {
      const auto needed = static_cast<std::size_t>(std::max(1, active_ - Mode::backups));
      if (in_step_ == 0 || in_step_ < needed) return;
      const V scale = V(1) / static_cast<V>(in_step_);
      if (replica_.active()) {
        // The step's sum goes to the standby first, so that it applies the update while this
        // server does (the step's pulls wait for its acknowledgement); the buffer it leaves
        // is the next step's sum.
        auto& step_sum = replica_.next_buffer();
        std::swap(sum_, step_sum);
        replica_.send(with_after(counters(), scale, stats_.version + 1, stats_.applied));
        apply(step_sum, scale);
      } else {
        apply(sum_, scale);
      }
      in_step_ = 0;
      ++stats_.version;
      std::fill(sum_.begin(), sum_.end(), V(0));
    }
  }

  // An update as its standby gets it: the counters it changes, now (before the update) ...
  detail::replica_header counters() const {
    detail::replica_header h{detail::replica_kind::update};
    h.version = stats_.version;
    h.updates = stats_.updates;
    h.applied = stats_.applied;
    return h;
  }
  // ... and after it, with the gradient's factor.
  static detail::replica_header with_after(detail::replica_header h, V scale, std::uint64_t version,
                                           std::uint64_t applied) {
    h.scale = static_cast<double>(scale);
    h.next_version = version;
    h.next_applied = applied;
    return h;
  }

  // What a server and its standby compare before replication starts: 64-bit words of the
  // shard's parameters, mixed (FNV-1a's step on words).
  std::uint64_t shard_checksum() const {
    std::uint64_t h = 1469598103934665603ull;
    for (const auto& tensor : shard_.tensors) {
      const auto bytes = std::as_bytes(std::span<const V>(tensor));
      std::size_t i = 0;
      for (std::uint64_t word; i + sizeof word <= bytes.size(); i += sizeof word) {
        std::memcpy(&word, bytes.data() + i, sizeof word);
        h = (h ^ word) * 1099511628211ull;
      }
      for (; i < bytes.size(); ++i) h = (h ^ static_cast<std::uint64_t>(bytes[i])) * 1099511628211ull;
    }
    return h;
  }

  // Whether `rank` is a peer the transport has lost (not a failure of this rank's own).
  bool peer_is_lost(int rank) const {
    if constexpr (concepts::loss_tolerant_transport<Tr>) {
      const auto lost = t_.lost_peers();
      return std::find(lost.begin(), lost.end(), rank) != lost.end();
    } else {
      return false;
    }
  }

  // Whether this rank writes its checkpoint at the end. Not a standby that took over but
  // served nothing (its server may be alive, cut off from it alone), nor a server that lost
  // its standby and had no worker finish (it may be the one cut off, while its standby
  // serves): either would write a stale shard over the file the other writes.
  bool keeps_its_checkpoint() const {
    const bool may_be_stale = (stats_.promoted && !served_since_promotion_) ||
                              (options_.standby && !is_standby_ && replica_.standby_lost() && finished_ == 0);
    if (may_be_stale && !checkpoint_.empty())
      observe::log_warning(comm_.rank(), comm_.size(), who_, ": not writing its checkpoint: ",
                           stats_.promoted ? "it took its server's shard over but no worker used it"
                                           : "it lost its standby and every worker",
                           " (it may have been cut off while the other served)");
    return !may_be_stale;
  }

  // A standby: applies its server's updates as they come, each acknowledged, until the
  // server finishes (false) or is lost (true: this rank now serves the shard).
  bool follow() {
    detail::replica_header h;
    detail::replica_ack ack;
    hello_server();
    try {
      typename Tr::request ack_send;
      for (;;) {
        auto header = t_.async_recv(server_rank_, detail::replica_tag, detail::writable_bytes_of(h));
        try {
          t_.wait(header, wait_deadline());
        } catch (const error& e) {
          if (e.kind() != errc::timeout) throw;
          throw error(errc::timeout, who_ + ": no update from server rank " + std::to_string(server_rank_) + " for " +
                                         std::to_string(options_.timeout.count()) + " ms; is it stopped or stuck?");
        }
        h = detail::decode_replica_header(detail::bytes_of(h), comm_.rank(), server_rank_, stats_.version,
                                          stats_.updates, stats_.applied);
        if (h.kind == detail::replica_kind::done) break;
        receive_from(server_rank_, detail::replica_gradient_tag, incoming_);
        stats_.version = h.version;
        stats_.applied = h.applied;
        apply(incoming_, static_cast<V>(h.scale));  // the same lr schedule inputs and factor as the server's
        stats_.version = h.next_version;
        stats_.replicated = stats_.applied = h.next_applied;
        if (ack_send) t_.wait(ack_send, wait_deadline());
        ack = {stats_.version, stats_.updates};
        ack_send = t_.async_send(server_rank_, detail::replica_ack_tag, detail::bytes_of(ack));
      }
      if (ack_send) t_.wait(ack_send, wait_deadline());
      return false;
    } catch (const error& e) {
      // Its server lost, not this rank failing (e.g. a sync worker's loss fails every rank).
      if (e.kind() != errc::peer_lost || !peer_is_lost(server_rank_)) throw;
      promote(e);
      return true;
    }
  }

  // A standby's half of replica_link::exchange_hello: both must start from the same
  // version and shard, or neither goes on (a standby that starts elsewhere must not take
  // over). Before the hellos, the server's loss cannot be a failover.
  void hello_server() {
    const detail::replica_hello mine{stats_.version, shard_checksum()};
    detail::replica_hello theirs;
    try {
      auto r = t_.async_recv(server_rank_, detail::replica_hello_tag, detail::writable_bytes_of(theirs));
      auto sent = t_.async_send(server_rank_, detail::replica_hello_tag, detail::bytes_of(mine));
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

  // The server was lost: this standby serves its shard from the last update it applied.
  // Each worker's clock starts there; sync workers resend the step's gradient (a step the
  // standby already closed drops it), async workers pull first.
  void promote(const error& e) {
    stats_.promoted = true;
    stats_.promoted_at = stats_.version;
    for (auto& slot : slots_) slot.clock = stats_.version;
    observe::log_warning(comm_.rank(), comm_.size(), who_, ": server rank ", server_rank_, " was lost (", e.details(),
                         "); serving its shard from version ", stats_.version, " after ", stats_.updates, " updates");
    who_ = "parameter server rank " + std::to_string(comm_.rank()) + " (standby of lost server rank " +
           std::to_string(server_rank_) + ")";
  }

  // A worker's request failed. Async modes over a transport that tolerates the loss drop
  // the worker and go on; anything else is fatal, and so is a peer_lost that is not this
  // worker's loss (a server lost, whose loss fails this rank's transport as a whole).
  // Elastic: its next request may come from a replacement process (take_back).
  void lose(int w, const error& e) {
    if (!(Mode::on_arrival && concepts::tolerates_loss(t_)) || e.kind() != errc::peer_lost || !peer_is_lost(w)) throw e;
    auto& slot = slot_of(w);
    if (slot.live) {  // a replacement that is lost before its first request was never counted
      slot.live = false;
      --active_;
      stats_.lost_workers.push_back(w);
      observe::log(options_.report ? observe::log_level::warning : observe::log_level::info, comm_.rank(),
                   comm_.size(), "parameter server: dropped worker rank ", w, ": ", e.what());
      if constexpr (Mode::on_arrival) advance_clock();
    }
    if constexpr (elastic_) {
      slot.lost = true;
      slot.pull_waiting = false;
      post_control(w);
    }
  }

  // A lost worker's replacement sent its first request: it is live again, from the
  // current version (so it does not hold the version back), with nothing pending.
  void take_back(int w) {
    auto& slot = slot_of(w);
    slot.lost = false;
    slot.live = true;
    ++active_;
    slot.clock = stats_.version;
    slot.staleness = 0;
    slot.pull_waiting = false;
    slot.reply_send = {};
    stats_.rejoined_workers.push_back(w);
    observe::log(options_.report ? observe::log_level::warning : observe::log_level::info, comm_.rank(), comm_.size(),
                 "parameter server: worker rank ", w, " rejoined (a replacement process) at version ", stats_.version);
  }

  // Whether worker w's waiting pull may be answered now: sync modes once the step it
  // wants has closed, bounded staleness once it is at most max_lead ahead of the slowest.
  bool may_answer(const worker_slot& slot) const {
    if constexpr (Mode::on_arrival) {
      const std::uint64_t lead = slot.clock - std::min(slot.clock, stats_.version);
      return Mode::max_lead < 0 || lead <= static_cast<std::uint64_t>(Mode::max_lead);
    } else {  // with a standby, once it has the current version: no worker holds parameters it lacks
      return stats_.version >= slot.pull_least && (!replica_.active() || replica_.acked_version() >= stats_.version);
    }
  }

  void answer_pulls() {
    for (int w = 0; w < workers_; ++w) {
      auto& slot = slot_of(w);
      if (!slot.live || !slot.pull_waiting || !may_answer(slot)) continue;
      if constexpr (Mode::on_arrival)
        stats_.max_lead = std::max(stats_.max_lead, slot.clock - std::min(slot.clock, stats_.version));
      try {
        send_reply(w);
      } catch (const error& e) {
        lose(w, e);
      }
    }
  }

  // [reply header][the shard's parameters]; over one-sided access only the header travels
  // and the worker gets the parameters from the window (it asks again only once it has
  // them, so they stay until then).
  void send_reply(int w) {
    auto trace = comm_.trace("pull", elements_ * sizeof(V), "ps.server");
    trace.arg("worker", w).arg("version", static_cast<std::int64_t>(stats_.version));
    auto& slot = slot_of(w);
    if (slot.reply_send) t_.wait(slot.reply_send, wait_deadline());  // the worker took it before asking again
    const detail::reply_header h{stats_.version,
                                 stats_.updates,
                                 stats_.applied,
                                 slot.staleness,
                                 static_cast<std::uint32_t>(stats_.lost_workers.size()),
                                 stats_.lost_workers.empty() ? -1 : stats_.lost_workers.back()};
    std::memcpy(std::as_writable_bytes(slot.reply).data(), &h, sizeof h);
    V* out = slot.reply.data() + detail::reply_header_elements<V>;
    for (const auto& tensor : shard_.tensors) out = std::copy(tensor.begin(), tensor.end(), out);
    const auto message = slot.reply.first(detail::reply_header_elements<V> + (slot.pull_in_window ? 0 : elements_));
    slot.reply_send = t_.async_send(w, detail::reply_tag, std::as_bytes(message));
    slot.pull_waiting = false;
  }

  // Replies already taken by finished workers: let them complete instead of cutting them off.
  void drain_replies() {
    for (auto& slot : slots_)
      if (slot.reply_send && !slot.live) {
        try {
          t_.wait(slot.reply_send, deadline_after(std::chrono::seconds(1)));
        } catch (const error&) {
        }
      }
  }

  void save() {
    if (checkpoint_.empty()) return;
    std::filesystem::create_directories(options_.checkpoint_dir);
    save_checkpoint(checkpoint_, shard_, stats_.version);
    saved_at_ = stats_.version;
  }

  communicator_type& comm_;
  Tr& t_;
  const options& options_;
  const int index_, workers_;  // this server's index among the servers; the workers: ranks [0, workers_)
  const int server_rank_;      // the rank of server index_ (this rank, or the one a standby follows)
  const bool is_standby_;
  std::span<const piece> pieces_;
  const std::size_t elements_;
  std::string who_;  // how messages name this rank (a standby that takes over is renamed)
  detail::shard_model<V, Optimizer> shard_;
  server_stats stats_;
  std::filesystem::path checkpoint_;
  std::uint64_t saved_at_ = 0;
  // Allocated (and touched) once: tagged gradients arrive into incoming_; sync modes sum
  // a step's gradients in sum_.
  std::vector<V> incoming_, sum_;
  std::size_t in_step_ = 0;  // gradients summed into the open step
  std::vector<worker_slot> slots_;
  std::vector<typename Tr::request*> pending_;  // [worker], then the standby's acknowledgement
  detail::replica_link<V, Tr> replica_;          // a server's standby (inactive without one)
  int active_;  // live workers
  int finished_ = 0;  // workers that said done
  bool served_since_promotion_ = false;  // a push or pull came (after a standby took over)
};

}  // namespace gradwire::ps
