// The worker side of a parameter server: per-server links, pushes as shards become ready, pulls, and windows.
//
// A worker's step pushes its gradient, one message per server with that server's pieces
// (sharding.hpp), and pulls the parameters back. A server's push starts as soon as every
// tensor it holds a piece of is ready (ready() counts them down per server), so the
// pushes of servers whose tensors backward produced first travel while backward still
// runs; finish_step() sends what is left, pulls and waits. Over one-sided access to a
// server (windows.hpp) the pieces are put straight from the gradient tensors into the
// server's window, and the push header follows once the puts are done: at the next
// shard's push or at finish_step(), so ready() never waits for its own puts.
//
// With standbys (options::standby), a server that is lost fails over: the worker sends
// that server's requests to its standby from then on (fail_over), resends the step's
// gradient in sync modes (the standby drops it if the step closed with it) and pulls
// again (recover).
//
// With a codec (push_codec.hpp) a push is each piece encoded through its own state (kept
// here, per server and piece) into one payload, sent as the gradient message or put into
// the server's window whole; a resend to a standby sends the same payload again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../aggregation/no_codec.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../timeouts.hpp"
#include "options.hpp"
#include "protocol.hpp"
#include "push_codec.hpp"
#include "shard.hpp"
#include "sharding.hpp"
#include "windows.hpp"

namespace gradwire::ps {

namespace detail {
// A lost server without a standby (or with its standby lost too) is fatal to the job:
// say what to do about it.
inline error server_loss(const error& e, bool had_standby = false) {
  return error(errc::peer_lost, "parameter_server: " + e.details() +
                                    (had_standby ? " (a parameter server and its standby were both lost, or the job "
                                                   "failed; restart the job with the same checkpoint directory)"
                                                 : " (a parameter server or the job failed; restart the job with the "
                                                   "same checkpoint directory to resume from the servers' last "
                                                   "checkpoints, or run servers with standbys: ps::options::standby)"));
}
template <class F>
void rethrow_server_loss(F&& f, bool had_standby = false) {
  try {
    f();
  } catch (const error& e) {
    if (e.kind() != errc::peer_lost) throw;
    throw server_loss(e, had_standby);
  }
}
}  // namespace detail

// Mode: concepts::ps_mode; V: the parameters' value type; Tr: concepts::transport; Codec:
// aggregation::no_codec, or the concepts::compressor<Codec, V> pushes go through.
template <concepts::ps_mode Mode, class V, class Tr, class Codec = aggregation::no_codec>
class worker {
  static constexpr bool compressed = !std::is_same_v<Codec, aggregation::no_codec>;
  struct no_encoder {};
  using encoder_type = std::conditional_t<compressed, detail::push_encoder<Codec, V>, no_encoder>;

 public:
  using communicator_type = collective::communicator<Tr>;

  // `first_server`: the rank of server 0 (the servers, then their standbys, are the last ranks).
  worker(const options& o, sharding shards, int first_server, Codec codec = Codec())
      : timeout_(o.timeout),
        report_(o.report),
        first_server_(first_server),
        standby_lag_(o.standby_lag),
        shards_(std::move(shards)),
        codec_(std::move(codec)) {
    links_.resize(static_cast<std::size_t>(shards_.servers()));
    for (int s = 0; s < shards_.servers(); ++s) {
      auto& l = link_to(s);
      l.rank = first_server + s;
      l.standby = o.standby ? first_server + o.servers + s : -1;
      if constexpr (compressed)  // the payload replaces the gathered pieces
        l.encoder = encoder_type(codec_, shards_.shard(s));
      else
        l.gradient = aligned_buffer<V>(shards_.elements(s));
      l.reply = aligned_buffer<V>(detail::reply_header_elements<V> + shards_.elements(s));
    }
    grads_.resize(shards_.tensors());
    ready_.assign(shards_.tensors(), false);
    waiting_.assign(links_.size(), 0);
  }

  // Servers that failed over to their standby so far.
  int failovers() const noexcept { return failovers_; }
  // From the latest answers: the servers' least version and most gradients applied, the
  // workers lost so far, and the staleness of this worker's latest gradient (the largest
  // over the servers; 0 in sync modes).
  std::uint64_t version() const noexcept { return min_version_; }
  std::uint64_t applied() const noexcept { return applied_; }
  std::uint32_t lost_workers() const noexcept { return lost_; }
  std::uint64_t last_staleness() const noexcept { return staleness_; }

  // Setup, the worker's half of server_window::expose(): takes each server's key and
  // attaches the windows of the servers the transport prefers one-sided access to.
  void attach_windows(communicator_type& comm)
    requires concepts::one_sided_transport<Tr>
  {
    auto& t = comm.transport();
    const auto until = comm.time().deadline_after(timeout_);
    const int workers = first_server_;
    for (int s = 0; s < shards_.servers(); ++s) {
      if (shards_.elements(s) == 0) continue;  // a server with nothing of this model has no window
      const int server = first_server_ + s;
      std::uint64_t key_size = 0;
      auto size_message = t.async_recv(server, detail::window_size_tag, detail::writable_bytes_of(key_size));
      detail::rethrow_server_loss([&] { t.wait(size_message, until); });
      auto& l = link_to(s);
      l.remote.reset();
      if (key_size == 0) continue;  // the server has no window: messages only
      if (key_size > (std::uint64_t{1} << 20))
        throw error(errc::protocol, "parameter_server: server rank " + std::to_string(server) +
                                        " sent a window key of " + std::to_string(key_size) + " bytes");
      std::vector<std::byte> key(key_size);
      auto key_message = t.async_recv(server, detail::window_key_tag, key);
      detail::rethrow_server_loss([&] { t.wait(key_message, until); });
      if (!t.prefers_one_sided(server)) continue;
      auto& remote = l.remote.emplace(t.attach(server, key));
      if constexpr (concepts::sized_remote_window<remote_window_t<Tr>>)
        if (remote.size() < zones(s).size(workers))
          throw error(errc::mismatch, "parameter_server: server rank " + std::to_string(server) +
                                          "'s window is smaller than this model's shard needs: do all ranks train "
                                          "the same model?");
    }
  }

  // --- the incremental step --------------------------------------------------------

  // A step starts: every server waits for all its tensors again. A step given up before
  // finish_step() keeps the pushes it already sent (the servers have them); they are
  // waited for here.
  void begin_step(communicator_type& comm) {
    if (in_step_) complete_pushes(comm);
    in_step_ = true;
    ++clock_;
    std::fill(ready_.begin(), ready_.end(), false);
    for (int s = 0; s < shards_.servers(); ++s) waiting_[static_cast<std::size_t>(s)] = shards_.tensors_of(s);
  }

  // Gradient i is final: the servers whose every tensor is now ready get their push, from
  // this thread. `grad` stays valid until finish_step() returns (one-sided puts read it).
  void ready(communicator_type& comm, std::size_t i, std::span<const V> grad) {
    if (!in_step_) throw error(errc::invalid_argument, "parameter_server: ready() outside a step (call begin_step first)");
    if (i >= ready_.size() || ready_[i])
      throw error(errc::invalid_argument, "parameter_server: gradient " + std::to_string(i) +
                                              (i >= ready_.size() ? " does not exist" : " was ready twice in this step"));
    ready_[i] = true;
    grads_[i] = grad;
    for (int s : shards_.servers_of(i)) {
      if (--waiting_[static_cast<std::size_t>(s)] > 0 || shards_.elements(s) == 0) continue;
      start_push(comm, s, grads_);
      send_push_headers(comm, s);  // earlier servers' puts are likely done: their headers go now
    }
  }

  // Every gradient was ready: sends the pushes still held back, pulls the parameters the
  // mode allows into `params` and waits for both. On the timeline the pull nests in the
  // push: the push is done only once it is sent.
  void finish_step(communicator_type& comm, std::span<const std::span<V>> params) {
    if (!in_step_) throw error(errc::invalid_argument, "parameter_server: finish_step() without begin_step()");
    const auto missing = std::find(ready_.begin(), ready_.end(), false);
    if (missing != ready_.end())
      throw error(errc::invalid_argument, "parameter_server: finish_step() before gradient " +
                                              std::to_string(missing - ready_.begin()) + " was ready");
    std::size_t model_bytes = 0;
    for (auto g : grads_) model_bytes += g.size_bytes();
    auto push_trace = comm.trace("push", model_bytes, "ps");
    push_trace.arg("clock", static_cast<std::int64_t>(clock_));
    send_push_headers(comm);
    {
      auto pull_trace = comm.trace("pull", model_bytes, "ps");
      pull(comm, params).wait();
      pull_trace.arg("version", static_cast<std::int64_t>(min_version_));
    }
    complete_pushes(comm);
    push_trace.arg("staleness", static_cast<std::int64_t>(staleness_));
  }

  // --- non-blocking push and pull, for overlapping them with compute by hand --------

  // A request to server s, as sent to `rank` (the server, or its standby after a failover).
  struct sent {
    int server = 0, rank = 0;
    typename Tr::request request;
  };

  class push_handle {
   public:
    push_handle(worker& w, communicator_type& comm, std::vector<sent> sends, deadline until)
        : worker_(&w), comm_(&comm), sends_(std::move(sends)), until_(until) {}
    void wait() {
      worker_->wait_all(*comm_, sends_, until_);
      worker_->recover(*comm_, /*pulling=*/false);
    }

   private:
    worker* worker_;
    communicator_type* comm_;
    std::vector<sent> sends_;
    deadline until_;
  };

  class pull_handle {
   public:
    pull_handle(worker& w, communicator_type& comm, std::span<const std::span<V>> params, std::vector<sent> requests,
                deadline until)
        : worker_(&w), comm_(&comm), params_(params), requests_(std::move(requests)), until_(until) {}
    // Waits for every server's answer (a standby's, for a server that failed over) and
    // writes the parameters into place.
    void wait() {
      worker_->wait_all(*comm_, requests_, until_);
      worker_->recover(*comm_, /*pulling=*/true);
      if constexpr (concepts::one_sided_transport<Tr>) {
        worker_->get_parameters(*comm_, params_, until_);
        worker_->recover(*comm_, /*pulling=*/true);  // a server lost before its parameters were got
      }
      worker_->take_replies(*comm_, params_);
    }

   private:
    worker* worker_;
    communicator_type* comm_;
    std::span<const std::span<V>> params_;
    std::vector<sent> requests_;
    deadline until_;
  };

  // Pushes the whole gradient at once (one of each handle may be in flight; not inside an
  // incremental step). Over one-sided access it returns once the gradient is in the
  // servers' memory.
  push_handle push(communicator_type& comm, std::span<const std::span<const V>> grads) {
    if (in_step_) throw error(errc::invalid_argument, "parameter_server: push() inside a step (finish it first)");
    ++clock_;
    for (int s = 0; s < shards_.servers(); ++s)
      if (shards_.elements(s) > 0) start_push(comm, s, grads);
    send_push_headers(comm);
    return push_handle(*this, comm, std::exchange(sends_, {}), comm.time().deadline_after(timeout_));
  }

  pull_handle pull(communicator_type& comm, std::span<const std::span<V>> params) {
    std::vector<sent> requests;
    requests.reserve(2 * links_.size());
    for (int s = 0; s < shards_.servers(); ++s)
      if (shards_.elements(s) > 0) start_pull(comm, s, requests);
    return pull_handle(*this, comm, params, std::move(requests), comm.time().deadline_after(timeout_));
  }

  // A worker that stops training tells every server (they stop waiting for it). Once.
  void finish(communicator_type& comm) {
    // A moved-from worker has no links (and its communicator no transport to ask).
    if (finished_ || links_.empty()) return;
    finished_ = true;
    if (in_step_) complete_pushes(comm);
    auto& t = comm.transport();
    std::vector<sent> sends, to_standbys;
    const detail::request_header done{detail::request_kind::done, 0, 0, clock_, 0};
    for (int s = 0; s < shards_.servers(); ++s) {
      const auto& l = link_to(s);
      sends.push_back({s, l.rank, t.async_send(l.rank, detail::request_tag, detail::bytes_of(done))});
      // A standby that takes over after this worker finished must not wait for it.
      if (l.standby >= 0)
        to_standbys.push_back({s, l.standby, t.async_send(l.standby, detail::request_tag, detail::bytes_of(done))});
    }
    wait_all(comm, sends, comm.time().deadline_after(prompt_reply_timeout));
    for (auto& q : to_standbys) {  // best effort: a standby ends with its server, maybe before this arrives
      try {
        t.wait(q.request, comm.time().deadline_after(prompt_reply_timeout));
      } catch (const error& e) {
        if (e.kind() != errc::peer_lost) throw;
      }
    }
  }

 private:
  // What this worker keeps per server, allocated once.
  struct link {
    int rank = 0;                // the server's rank; its standby's after a failover
    int standby = -1;            // its standby's rank, until it fails over to it (-1: none)
    bool recovering = false;     // failed over while a pull to the lost server was due: pull again
    bool pulling = false;        // a pull is in flight or its reply not yet taken
    aligned_buffer<V> gradient;  // a tagged push's pieces, gathered (without a codec)
    [[no_unique_address]] encoder_type encoder;  // with a codec: a state per piece and the payload
    aligned_buffer<V> reply;     // [reply header][shard parameters], as the server sends it
    detail::request_header push, pull;
    std::uint64_t version = 0, updates = 0;  // from the server's latest reply
    // One-sided access: the server's window, when the transport prefers it to that server;
    // the clock of the latest gradient put there, and of the latest one the server is
    // known to have taken (a reply to a later pull): a gradient goes into the window only
    // when the one before it was taken.
    std::optional<remote_window_t<Tr>> remote;
    std::uint64_t put_clock = 0, taken_clock = 0;
    std::vector<typename Tr::request> puts;  // this push's puts, until its header follows them
    bool header_held = false;                // a one-sided push whose header waits for its puts
  };

  link& link_to(int s) noexcept { return links_[static_cast<std::size_t>(s)]; }
  detail::window_layout zones(int s) const noexcept {
    if constexpr (compressed)  // the gradient zone holds the payload
      return detail::window_layout::of<V>(shards_.elements(s), links_[static_cast<std::size_t>(s)].encoder.bytes());
    else
      return detail::window_layout::of<V>(shards_.elements(s));
  }

  // Starts server s's push of this clock's gradient: its pieces put into the server's
  // window (header held back until they are there), or gathered and sent.
  void start_push(communicator_type& comm, int s, std::span<const std::span<const V>> grads) {
    auto& t = comm.transport();
    auto& l = link_to(s);
    const int server = l.rank;
    if constexpr (concepts::one_sided_transport<Tr>) {
      if (l.remote && l.taken_clock >= l.put_clock) {
        const std::size_t zone = zones(s).gradient(comm.rank());
        if constexpr (compressed) {  // one put of the payload, which stays for a resend
          l.encoder.encode(codec_, shards_.shard(s), grads);
          if (l.encoder.bytes() > 0) l.puts.push_back(t.async_put(*l.remote, zone, l.encoder.payload()));
        } else {
          detail::for_each_piece_at<V>(shards_.shard(s), zone, [&](const piece& p, std::size_t at) {
            l.puts.push_back(t.async_put(*l.remote, at, std::as_bytes(grads[p.tensor].subspan(p.begin, p.size()))));
          });
        }
        l.put_clock = clock_;
        l.push = {detail::request_kind::push, detail::in_window, l.version, clock_, l.updates};
        l.header_held = true;
        // Sync modes with a standby: a copy to resend if the server is lost before the step
        // closes (the caller may reuse its gradient once the puts are done).
        if constexpr (!compressed)
          if (!Mode::on_arrival && l.standby >= 0) detail::gather(shards_.shard(s), grads, l.gradient.data());
        return;
      }
    }
    // Async modes, failed over but not yet told the standby's counters: none (the standby's
    // may be behind the lost server's, and a push may not claim more than its server has).
    const bool counters_unknown = Mode::on_arrival && l.recovering;
    // Encoded before the header goes: a codec that refuses the gradient fails here, before
    // the server waits for it.
    if constexpr (compressed) l.encoder.encode(codec_, shards_.shard(s), grads);
    l.push = {detail::request_kind::push, 0, counters_unknown ? 0 : l.version, clock_, counters_unknown ? 0 : l.updates};
    sends_.push_back({s, server, t.async_send(server, detail::request_tag, detail::bytes_of(l.push))});
    if constexpr (compressed) {
      sends_.push_back({s, server, t.async_send(server, detail::gradient_tag, l.encoder.payload())});
    } else {
      detail::gather(shards_.shard(s), grads, l.gradient.data());
      sends_.push_back({s, server, t.async_send(server, detail::gradient_tag,
                                                std::as_bytes(l.gradient.span().first(shards_.elements(s))))});
    }
  }

  // Server s's pull: its reply header (and parameters, without a window) into l.reply.
  void start_pull(communicator_type& comm, int s, std::vector<sent>& requests) {
    auto& t = comm.transport();
    auto& l = link_to(s);
    const bool windowed = l.remote.has_value();
    // Sync modes: the step after the one this worker's gradient went into.
    const std::uint64_t wanted = (!Mode::on_arrival && clock_ > 0) ? l.version + 1 : 0;
    l.pull = {detail::request_kind::pull, windowed ? detail::in_window : 0, wanted, clock_, 0};
    l.pulling = true;
    l.recovering = false;  // this pull goes to the shard's current rank
    const auto reply = l.reply.span().first(detail::reply_header_elements<V> + (windowed ? 0 : shards_.elements(s)));
    requests.push_back({s, l.rank, t.async_recv(l.rank, detail::reply_tag, std::as_writable_bytes(reply))});
    requests.push_back({s, l.rank, t.async_send(l.rank, detail::request_tag, detail::bytes_of(l.pull))});
  }

  // Waits for each request; a server lost on the way fails over (when it has a standby),
  // and a request to a server that already failed over is moot. Empties `requests`.
  void wait_all(communicator_type& comm, std::vector<sent>& requests, deadline until) {
    for (auto& q : requests)
      if (q.request) wait_for(comm, q.server, q.rank, q.request, until);
    requests.clear();
  }
  bool wait_for(communicator_type& comm, int s, int rank, typename Tr::request& r, deadline until) {
    try {
      comm.transport().wait(r, until);
      return true;
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
      auto& l = link_to(s);
      if (rank != l.rank) return false;  // its server was lost, and the shard has failed over already
      if (l.standby < 0) throw detail::server_loss(e, failed_over(s));
      // A loss of this rank's own (a sync job fails every rank when a worker dies) is no failover.
      if (!concepts::has_lost(comm.transport(), rank)) throw;
      fail_over(comm, s, e);
      return false;
    }
  }
  bool failed_over(int s) const { return links_[static_cast<std::size_t>(s)].rank != first_server_ + s; }

  // Server s was lost: its standby serves the shard from now on, by messages. A sync
  // step's gradient that the server may not have closed a step with is resent at once
  // (the standby drops it if it has that step's update; it cannot have it otherwise, as
  // it only learns of gradients through updates), so that the pull that follows can be answered.
  void fail_over(communicator_type& comm, int s, const error& e) {
    auto& l = link_to(s);
    observe::log(comm.time(), observe::log_level::warning, comm.rank(), comm.size(), "parameter_server: server rank ", l.rank, " was lost (", e.details(),
                         "); its shard fails over to standby rank ", l.standby);
    l.rank = std::exchange(l.standby, -1);
    l.remote.reset();
    l.recovering = true;
    ++failovers_;
    if (Mode::on_arrival || l.taken_clock >= l.push.clock || l.push.clock == 0) return;
    l.push.flags = 0;  // by message, from the copy every push keeps (start_push)
    auto& t = comm.transport();
    std::vector<sent> resend;
    resend.push_back({s, l.rank, t.async_send(l.rank, detail::request_tag, detail::bytes_of(l.push))});
    if constexpr (compressed)  // the payload sent before: encoding again would move the states twice
      resend.push_back({s, l.rank, t.async_send(l.rank, detail::gradient_tag, l.encoder.payload())});
    else
      resend.push_back({s, l.rank, t.async_send(l.rank, detail::gradient_tag,
                                                std::as_bytes(l.gradient.span().first(shards_.elements(s))))});
    for (auto& q : resend) detail::rethrow_server_loss([&] { t.wait(q.request, comm.time().deadline_after(timeout_)); });
  }

  // After a failover: the pull of a shard whose server was lost is asked of its standby
  // (`pulling`: the caller takes the replies next), or, in async modes outside a pull,
  // the standby's counters are fetched so that the next push carries its version.
  void recover(communicator_type& comm, bool pulling) {
    std::vector<sent> requests;
    for (int s = 0; s < shards_.servers(); ++s) {
      auto& l = link_to(s);
      if (!l.recovering || (!pulling && l.pulling)) continue;  // a pull in flight recovers it when waited for
      l.recovering = false;
      if (!pulling && !Mode::on_arrival) continue;  // sync: the next pull asks the standby
      start_pull(comm, s, requests);  // sync: the same step the lost pull waited for
    }
    for (auto& q : requests)
      detail::rethrow_server_loss([&] { comm.transport().wait(q.request, comm.time().deadline_after(timeout_)); }, true);
    for (int s = 0; s < shards_.servers(); ++s) {
      auto& l = link_to(s);
      if (!std::ranges::any_of(requests, [&](const sent& q) { return q.server == s; })) continue;
      const auto h = detail::decode_reply(std::as_bytes(l.reply.span()), l.rank, l.pull.version, first_server_);
      // A standby trails its server by at most standby_lag updates (sync: none). More means it
      // lost contact with its server earlier and went on alone: training on it would roll back.
      if (h.updates + (Mode::on_arrival ? standby_lag_ : 0) < l.updates)
        throw error(errc::peer_lost, "parameter_server: standby rank " + std::to_string(l.rank) + " has " +
                                         std::to_string(h.updates) + " updates, its lost server had " +
                                         std::to_string(l.updates) + " (more than ps::options::standby_lag = " +
                                         std::to_string(standby_lag_) + " apart): it was cut off from its server "
                                         "earlier; the shard cannot fail over (restart from the checkpoints)");
      if (!pulling) {
        l.version = h.version;
        l.updates = h.updates;
        l.pulling = false;
      }
    }
  }

  // Sends the headers held back for one-sided pushes (but server `except`'s), each once
  // its puts are in the server's memory.
  void send_push_headers(communicator_type& comm, int except = -1) {
    auto& t = comm.transport();
    const auto until = comm.time().deadline_after(timeout_);
    for (int s = 0; s < shards_.servers(); ++s) {
      auto& l = link_to(s);
      if (!l.header_held || s == except) continue;
      bool in_memory = true;
      for (auto& r : l.puts) in_memory = in_memory && wait_for(comm, s, l.rank, r, until);
      l.puts.clear();
      l.header_held = false;
      if (in_memory) sends_.push_back({s, l.rank, t.async_send(l.rank, detail::request_tag, detail::bytes_of(l.push))});
    }
  }

  // Every push of this step is sent (its buffers free for the next).
  void complete_pushes(communicator_type& comm) {
    send_push_headers(comm);
    wait_all(comm, sends_, comm.time().deadline_after(timeout_));
    recover(comm, /*pulling=*/false);
    in_step_ = false;
  }

  // After the servers' reply headers: gets each shard's parameters from the windows
  // straight into the parameter tensors.
  void get_parameters(communicator_type& comm, std::span<const std::span<V>> params, deadline until) {
    auto& t = comm.transport();
    std::vector<sent> gets;
    for (int s = 0; s < shards_.servers(); ++s) {
      auto& l = link_to(s);
      if (!l.remote || shards_.elements(s) == 0) continue;
      const std::size_t at = zones(s).reply(comm.rank()) + sizeof(detail::reply_header);
      detail::for_each_piece_at<V>(shards_.shard(s), at, [&](const piece& p, std::size_t piece_at) {
        gets.push_back({s, l.rank, t.async_get(*l.remote, piece_at,
                                               std::as_writable_bytes(params[p.tensor].subspan(p.begin, p.size())))});
      });
    }
    wait_all(comm, gets, until);
  }

  // Reads every server's reply: parameters into place (tagged replies), versions, the
  // staleness of this worker's gradient, and workers lost (the chief reports new losses).
  void take_replies(communicator_type& comm, std::span<const std::span<V>> params) {
    std::uint64_t least = ~std::uint64_t{0}, updates = 0;
    std::uint32_t lost = 0;
    int last_lost = -1;
    staleness_ = 0;
    for (int s = 0; s < shards_.servers(); ++s) {
      if (shards_.elements(s) == 0) continue;
      auto& l = link_to(s);
      const detail::reply_header h =
          detail::decode_reply(std::as_bytes(l.reply.span()), l.rank, l.pull.version, first_server_);
      l.pulling = false;
      if (!l.remote)  // one-sided: get_parameters() put them in place
        detail::scatter(shards_.shard(s), l.reply.data() + detail::reply_header_elements<V>, params);
      l.taken_clock = std::max(l.taken_clock, l.pull.clock);
      l.version = h.version;
      l.updates = h.updates;
      least = std::min(least, h.version);
      updates = std::max(updates, h.applied);
      staleness_ = std::max(staleness_, h.staleness);
      if (h.lost > lost) lost = h.lost, last_lost = h.last_lost;
    }
    if (least != ~std::uint64_t{0}) min_version_ = least;
    applied_ = updates;
    if (lost > lost_ && comm.rank() == 0)
      observe::log(comm.time(), report_ ? observe::log_level::warning : observe::log_level::info, comm.rank(), comm.size(),
                   "parameter_server: worker rank ", last_lost, " was lost (", lost,
                   " worker(s) lost so far); training goes on without it");
    lost_ = std::max(lost_, lost);
  }

  std::chrono::milliseconds timeout_;
  bool report_ = true;
  int first_server_ = 0;
  std::uint32_t standby_lag_ = 0;  // async modes: updates a standby may trail its server by
  sharding shards_;
  [[no_unique_address]] Codec codec_;           // pushes go through it (none: aggregation::no_codec)
  std::vector<link> links_;                     // [server]
  std::vector<std::span<const V>> grads_;       // this step's gradients, as ready() gave them
  std::vector<bool> ready_;                     // [tensor]: ready in this step
  std::vector<std::size_t> waiting_;            // [server]: its tensors not ready yet in this step
  std::vector<sent> sends_;                     // this step's tagged sends, until complete_pushes()
  bool in_step_ = false;
  std::uint64_t clock_ = 0;                     // this worker's pushes
  std::uint64_t min_version_ = 0, applied_ = 0, staleness_ = 0;
  std::uint32_t lost_ = 0;
  int failovers_ = 0;
  bool finished_ = false;
};

}  // namespace gradwire::ps
