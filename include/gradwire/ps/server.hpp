// The server side of a parameter server: the loop that takes pushes, applies updates and answers pulls.
//
// A server owns its shard's values and optimizer state (shard.hpp). It waits for whichever
// worker speaks next (concepts::multiplexing_transport), handles that request (on_push,
// on_pull, on_done), answers the pulls the mode now allows (answer_pulls), and checkpoints
// when due, until every worker has finished or was lost (membership.hpp). What a push does
// and when a pull may be answered is the mode's step rule (step_rule.hpp): sync modes sum a
// step's gradients and apply their mean when the step is full; async modes apply each on
// arrival and record its staleness and update lag.
//
// With standbys (options::standby), a server sends every update it applies to its standby
// (replica.hpp), and a standby rank runs the same class: it follows its server's updates
// until the server finishes, or takes the shard over when it is lost (standby.hpp) and
// then serves the workers as its server did.
//
// With a codec (push_codec.hpp) a push's payload is decoded into the shard's order before
// anything else sees it (take_gradient, add_gradient): updates, what the standby mirrors,
// checkpoints and replies are in V, as without one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../aggregation/no_codec.hpp"
#include "../checkpoint.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../timeouts.hpp"
#include "membership.hpp"
#include "options.hpp"
#include "protocol.hpp"
#include "push_codec.hpp"
#include "replica.hpp"
#include "shard.hpp"
#include "sharding.hpp"
#include "standby.hpp"
#include "stats.hpp"
#include "step_rule.hpp"
#include "windows.hpp"

namespace gradwire::ps {

// Mode: concepts::ps_mode; V: the parameters' value type; Tr: a multiplexing transport;
// Optimizer: concepts::optimizer for V (concepts::schedulable_optimizer to run a learning-rate
// schedule: agent::serve takes one only then; options::learning_rate is checked at start);
// Codec: aggregation::no_codec, or the concepts::compressor<Codec, V> pushes come through.
template <concepts::ps_mode Mode, class V, class Tr, class Optimizer, class Codec = aggregation::no_codec>
class server {
  using rule = step_rule<Mode>;
  static constexpr bool compressed = !std::is_same_v<Codec, aggregation::no_codec>;
  struct no_decoder {};
  using decoder_type = std::conditional_t<compressed, detail::push_decoder<Codec, V>, no_decoder>;

 public:
  using mode = Mode;
  using value_type = V;
  using transport_type = Tr;
  using optimizer_type = Optimizer;
  using communicator_type = collective::communicator<Tr>;

  // `params`: this rank's parameter tensors (the shard is a view into them, so they hold
  // the final values when run() returns); `window`: what setup exposed (may be none);
  // `schedule`: the learning-rate schedule given to serve(schedule), if any (agent::serve
  // gives one only for a schedulable optimizer), else options::learning_rate; `codec`: the
  // workers' (with a codec, `window`'s gradient zones hold its payloads).
  server(communicator_type& comm, std::span<const std::span<V>> params, const Optimizer& optimizer,
         const options& o, const sharding& shards, server_window<V, Tr>& window,
         learning_rate_schedule schedule = {}, const Codec& codec = Codec())
      : comm_(comm),
        t_(comm.transport()),
        options_(o),
        index_((comm.rank() - (comm.size() - o.serving_ranks())) % o.servers),
        workers_(comm.size() - o.serving_ranks()),
        server_rank_(workers_ + index_),
        is_standby_(o.standby && comm.rank() != server_rank_),
        who_(std::string(is_standby_ ? "parameter server standby rank " : "parameter server rank ") +
             std::to_string(comm.rank())),
        shard_(params, shards.shard(index_), optimizer),
        members_(t_, workers_, shard_.elements(), window, stats_, who_, o.report),
        incoming_(shard_.elements()),
        sum_(rule::step_elements(shard_.elements())),
        pending_(static_cast<std::size_t>(workers_) + 1),
        schedule_(one_schedule(std::move(schedule), o)),
        window_(window),
        decoder_(make_decoder(codec, shards, index_)) {
    // The options do not know the optimizer: a schedule there is checked here, before
    // serving (serve(schedule) checks it at compile time).
    if constexpr (!concepts::schedulable_optimizer<Optimizer>)
      if (schedule_)
        throw error(errc::invalid_argument,
                    "parameter_server: ps::options::learning_rate needs an optimizer with set_lr(double)");
    if (!options_.checkpoint_dir.empty())
      checkpoint_ = options_.checkpoint_dir / ("ps-shard-" + std::to_string(index_) + "-of-" +
                                               std::to_string(options_.servers) + ".ckpt");
    if (!checkpoint_.empty() && std::filesystem::exists(checkpoint_))
      stats_.resumed_from = stats_.version = load_checkpoint(checkpoint_, shard_);
    saved_at_ = stats_.version;
    members_.start_clocks_at(stats_.version);
    if (o.standby && !is_standby_)
      replica_ = detail::replica_link<V, Tr>(t_, server_rank_, server_rank_ + o.servers, shard_.elements(),
                                             rule::replica_ring(o.standby_lag), stats_.version, o.timeout);
    stats_.pushes.assign(static_cast<std::size_t>(workers_), 0);
    stats_.dropped_by.assign(static_cast<std::size_t>(workers_), 0);
  }
  // Its parts hold references into it (members_ to stats_ and who_).
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Serves until every worker has finished or was lost; then writes the final checkpoint
  // and returns what it saw.
  server_stats run() {
    if (is_standby_ && !follow()) return stats_;  // its server finished: so has the standby
    if (replica_.active()) replica_.exchange_hello(stats_.version, shard_.checksum());
    observe::log(comm_.time(), observe::log_level::info, comm_.rank(), comm_.size(), "parameter server (", Mode::name, ") for ", workers_,
                      " worker(s): shard of ", shard_.elements(), " elements in ", shard_.pieces().size(), " piece(s)",
                      stats_.resumed_from ? ", resumed from version " : "",
                      stats_.resumed_from ? std::to_string(stats_.resumed_from) : std::string());
    for (int w = 0; w < workers_; ++w) post_control(w);
    while (members_.active() > 0) {
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
    observe::log(comm_.time(), observe::log_level::info, comm_.rank(), comm_.size(), "parameter server done: version ", stats_.version, ", ",
                      stats_.updates, " updates, ", stats_.applied, " gradients applied, ", stats_.dropped,
                      " dropped, ", stats_.lost_workers.size(), " worker loss(es), ", stats_.rejoined_workers.size(),
                      " rejoin(s)");
    return stats_;
  }

 private:
  friend rule;  // its handlers take gradients, apply updates and count them through the members below

  // serve(schedule)'s or the options', not both.
  static learning_rate_schedule one_schedule(learning_rate_schedule given, const options& o) {
    if (!given) return o.learning_rate;
    if (o.learning_rate)
      throw error(errc::invalid_argument, "parameter_server: a learning-rate schedule given twice, in "
                                          "ps::options::learning_rate and to serve(schedule); give one");
    return given;
  }

  deadline wait_deadline() const { return comm_.time().deadline_after(options_.timeout); }

  // A standby: follows its server until the server finishes (false) or is lost (true:
  // this rank serves the shard, each worker's clock starting at the version it has; sync
  // workers resend the step's gradient, which a step the standby already closed drops,
  // async workers pull first).
  bool follow() {
    detail::standby<V, Tr> standby(t_, server_rank_, options_.timeout, stats_, who_);
    const auto update = [this](std::span<const V> gradient, V scale) { apply(gradient, scale); };
    if (!standby.follow(shard_.checksum(), std::span<V>(incoming_), update)) return false;
    members_.start_clocks_at(stats_.version);
    return true;
  }

  // Where membership drops a worker (its request failed, or its link was lost before its
  // next request could be posted), the rule moves on without it.
  void lose(int w, const error& e) {
    if (members_.lose(w, e)) rule::on_leave(*this);
  }
  void post_control(int w) {
    if (members_.post_control(w)) rule::on_leave(*this);
  }

  // The worker whose request arrived first; workers_ for the standby's acknowledgement.
  int next_request() {
    for (int w = 0; w < workers_; ++w) {
      auto& slot = members_.slot(w);
      pending_[static_cast<std::size_t>(w)] = slot.live || slot.lost ? &slot.control : nullptr;
    }
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
                                     " ms (" + std::to_string(members_.active()) +
                                     " still expected); are they stuck, or is the timeout too short?");
    }
  }

  void on_request(int w) {
    auto& slot = members_.slot(w);
    t_.wait(slot.control, wait_deadline());
    slot.header = detail::decode_request(detail::bytes_of(slot.header), comm_.rank(), w, stats_.version, stats_.updates);
    if (members_.link_lost(w)) {  // a request the lost process left behind
      if (slot.lost) return post_control(w);  // keep waiting for its replacement
      if (slot.header.kind != detail::request_kind::done)
        throw error(errc::peer_lost,
                    members_.worker_name(w) + ": its connection was lost before its request was served");
    }
    if (slot.lost) members_.take_back(w);
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
        throw error(errc::protocol, members_.worker_name(w) + " sent an unknown request kind " +
                                        std::to_string(static_cast<std::uint32_t>(slot.header.kind)));
    }
  }

  void on_push(int w) {
    auto trace = comm_.trace("push", shard_.elements() * sizeof(V), "ps.server");
    trace.arg("worker", w);
    auto& slot = members_.slot(w);
    const detail::request_header h = slot.header;
    const bool in_window = (h.flags & detail::in_window) != 0;
    if (in_window && !slot.windowed)
      throw error(errc::protocol, members_.worker_name(w) + " pushed into a window this server does not have");
    ++slot.clock;
    rule::on_push(*this, w, h, in_window);
    // Counted once its gradient has arrived: a worker killed mid-push sent none, and
    // applied + dropped == pushes holds through losses.
    ++stats_.pushes[static_cast<std::size_t>(w)];
    stats_.one_sided += in_window ? 1 : 0;
  }

  void on_done(int w) {
    members_.finish(w);
    rule::on_leave(*this);
  }

  // A push's gradient: a one-sided one is in the window already, a tagged one arrives now.
  // Through a codec: its payload, decoded into incoming_.
  std::span<const V> take_gradient(int w, bool in_window) {
    if constexpr (compressed) {
      decoder_.template decode<false>(take_payload(w, in_window), std::span<V>(incoming_), worker_named(w));
      return incoming_;
    } else {
      if (in_window) return members_.slot(w).window_gradient;
      auto r = t_.async_recv(w, detail::gradient_tag, std::as_writable_bytes(std::span<V>(incoming_)));
      t_.wait(r, wait_deadline());
      return incoming_;
    }
  }
  // Through a codec, a sync step's: the payload decoded and added into `sum` in one pass.
  void add_gradient(int w, bool in_window, std::span<V> sum)
    requires compressed
  {
    decoder_.template decode<true>(take_payload(w, in_window), sum, worker_named(w));
  }
  std::span<const std::byte> take_payload(int w, bool in_window)
    requires compressed
  {
    if (in_window) return window_.payload(w);
    auto r = t_.async_recv(w, detail::gradient_tag, decoder_.landing());
    t_.wait(r, wait_deadline());
    return decoder_.landing();
  }
  auto worker_named(int w) const {
    return [this, w] { return members_.worker_name(w); };
  }
  static decoder_type make_decoder(const Codec& codec, const sharding& shards, int index) {
    if constexpr (compressed)
      return decoder_type(codec, shards.shard(index));
    else
      return {};
  }

  void on_pull(int w) {
    auto& slot = members_.slot(w);
    const bool in_window = (slot.header.flags & detail::in_window) != 0;
    if (in_window && !slot.windowed)
      throw error(errc::protocol,
                  members_.worker_name(w) + " asked for a one-sided pull from a window this server does not have");
    slot.pull_waiting = true;
    slot.pull_in_window = in_window;
    slot.pull_least = slot.header.version;
  }

  // Updates the shard with `gradient` * scale, at the learning rate the schedule gives now.
  void apply(std::span<const V> gradient, V scale) {
    if constexpr (concepts::schedulable_optimizer<Optimizer>)
      if (schedule_) shard_.set_lr(schedule_(stats_.version, stats_.applied));
    auto trace = comm_.trace("optimizer_step", gradient.size_bytes(), "optimizer");
    trace.arg("version", static_cast<std::int64_t>(stats_.version));
    shard_.apply(gradient, scale);
    ++stats_.updates;
  }

  void answer_pulls() {
    for (int w = 0; w < workers_; ++w) {
      auto& slot = members_.slot(w);
      if (!slot.live || !slot.pull_waiting || !rule::may_answer(*this, slot)) continue;
      rule::on_answer(stats_, slot);
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
    auto trace = comm_.trace("pull", shard_.elements() * sizeof(V), "ps.server");
    trace.arg("worker", w).arg("version", static_cast<std::int64_t>(stats_.version));
    auto& slot = members_.slot(w);
    if (slot.reply_send) t_.wait(slot.reply_send, wait_deadline());  // the worker took it before asking again
    const detail::reply_header h{stats_.version,
                                 stats_.updates,
                                 stats_.applied,
                                 slot.staleness,
                                 static_cast<std::uint32_t>(stats_.lost_workers.size()),
                                 stats_.lost_workers.empty() ? -1 : stats_.lost_workers.back()};
    std::memcpy(std::as_writable_bytes(slot.reply).data(), &h, sizeof h);
    shard_.copy_to(slot.reply.data() + detail::reply_header_elements<V>);
    const auto message =
        slot.reply.first(detail::reply_header_elements<V> + (slot.pull_in_window ? 0 : shard_.elements()));
    slot.reply_send = t_.async_send(w, detail::reply_tag, std::as_bytes(message));
    slot.pull_waiting = false;
  }

  // Replies already taken by finished workers: let them complete instead of cutting them off.
  void drain_replies() {
    for (auto& slot : members_.slots())
      if (slot.reply_send && !slot.live) {
        try {
          t_.wait(slot.reply_send, comm_.time().deadline_after(std::chrono::seconds(1)));
        } catch (const error&) {
        }
      }
  }

  // Whether this rank writes its checkpoint at the end. Not a standby that took over but
  // served nothing (its server may be alive, cut off from it alone), nor a server that lost
  // its standby and had no worker finish (it may be the one cut off, while its standby
  // serves): either would write a stale shard over the file the other writes.
  bool keeps_its_checkpoint() const {
    const bool lost_all = options_.standby && !is_standby_ && replica_.standby_lost() && members_.finished() == 0;
    const bool may_be_stale = (stats_.promoted && !served_since_promotion_) || lost_all;
    if (may_be_stale && !checkpoint_.empty())
      observe::log(comm_.time(), observe::log_level::warning, comm_.rank(), comm_.size(), who_, ": not writing its checkpoint: ",
                           stats_.promoted ? "it took its server's shard over but no worker used it"
                                           : "it lost its standby and every worker",
                           " (it may have been cut off while the other served)");
    return !may_be_stale;
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
  std::string who_;  // how messages name this rank (a standby that takes over is renamed)
  server_stats stats_;
  detail::shard<V, Optimizer> shard_;
  detail::membership<rule, V, Tr> members_;
  std::filesystem::path checkpoint_;
  std::uint64_t saved_at_ = 0;
  // Allocated (and touched) once: tagged gradients arrive into incoming_; sync modes sum
  // a step's gradients in sum_ (step_rule::step_elements).
  std::vector<V> incoming_, sum_;
  std::size_t in_step_ = 0;  // gradients summed into the open step
  std::vector<typename Tr::request*> pending_;  // [worker], then the standby's acknowledgement
  detail::replica_link<V, Tr> replica_;          // a server's standby (inactive without one)
  bool served_since_promotion_ = false;  // a push or pull came (after a standby took over)
  const learning_rate_schedule schedule_;  // empty: the optimizer's own lr throughout
  server_window<V, Tr>& window_;           // where one-sided pushes land (payloads, with a codec)
  [[no_unique_address]] decoder_type decoder_;  // with a codec: the payload's layout and landing buffer
};

}  // namespace gradwire::ps
