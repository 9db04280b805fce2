// Parameter servers (ParameterServerStrategy, Downpour, SSP, backup workers): variables sharded over server ranks.
//
// Roles: the last `servers` ranks serve (the order of a TF_CONFIG cluster: chief,
// workers, ps); the others are workers. Every tensor is cut into pieces (a tensor larger
// than split_bytes is split evenly over the servers) and the pieces are dealt to the
// servers largest first, each to the least loaded one, so shards are balanced by size.
// A server owns its pieces' values and optimizer state and applies every update.
//
// A worker's step pushes its gradient (one message per server with that server's
// pieces) and pulls the parameters back; both are non-blocking, with handles. Over a
// transport with one-sided access (concepts::one_sided_transport, e.g. UCX between
// processes of one machine) to a server it prefers it for, each server exposes one
// landing zone per worker: the worker puts its gradient there and gets the parameters
// from there, and only small request and reply headers travel as messages. The mode
// decides when a server applies gradients and when it answers a pull:
//   ps::sync               one gradient from every live worker, then one update (mean);
//   ps::backup_workers<b>  a step closes after the first N-b gradients; gradients that
//                          arrive for a closed step are dropped and counted (Chen et al. 2016);
//   ps::async              each gradient is applied on arrival; a pull is answered at once;
//   ps::bounded_staleness<s>  async, but a worker more than s steps ahead of the slowest
//                          live worker waits for its pull (stale synchronous parallel).
// A server's version counts steps: closed steps (sync modes), or the number of gradients
// every live worker has pushed (async modes, the slowest worker's clock). A gradient's
// staleness is the server's version when it arrives minus the version the worker pulled
// (0 in sync modes; at most s under bounded_staleness<s>); its update lag is the number
// of updates the server applied in between (what an async gradient really missed).
//
// Fault tolerance (async modes, over a transport that can tolerate a loss): a worker
// that dies is dropped by the servers, the others go on, and the chief reports it. A lost
// server is an error on every rank; servers checkpoint their shards every K steps and at
// exit, and a job restarted with the same checkpoint directory resumes from them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../checkpoint.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../timeouts.hpp"
#include "../observe/log.hpp"
#include "../ps/modes.hpp"
#include "../ps/options.hpp"
#include "../ps/protocol.hpp"
#include "../ps/sharding.hpp"
#include "../ps/stats.hpp"

namespace gradwire {

namespace aggregation {

template <class Mode>
class parameter_server {
  static_assert(concepts::ps_mode<Mode>,
                "aggregation::parameter_server<Mode>: Mode needs static name, on_arrival, backups and max_lead "
                "(use ps::sync, ps::async, ps::bounded_staleness<s> or ps::backup_workers<b>)");

 public:
  using mode = Mode;

  explicit parameter_server(ps::options o = {}) : options_(std::move(o)) {}

  const ps::options& options() const noexcept { return options_; }
  int servers() const noexcept { return options_.servers; }
  bool is_server(int rank, int size) const noexcept { return rank >= size - options_.servers; }
  int first_server(int size) const noexcept { return size - options_.servers; }

  // Worker's view, from the latest answers: the servers' least version and most updates.
  std::uint64_t version() const noexcept { return min_version_; }
  std::uint64_t applied() const noexcept { return applied_; }
  std::uint32_t lost_workers() const noexcept { return lost_; }
  // The staleness of this worker's latest gradient (the servers' version when it arrived
  // minus the version it was computed on; the largest over servers; 0 in sync modes).
  std::uint64_t last_staleness() const noexcept { return staleness_; }

  // Every rank starts from the chief's parameters (rank 0, a worker); then each worker
  // pulls from the servers, which may have resumed from a checkpoint.
  template <class Tr, class V>
  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    static_assert(concepts::multiplexing_transport<Tr>,
                  "aggregation::parameter_server needs a transport with wait_any (asio_tcp, inproc)");
    const int n = comm.size();
    if (options_.servers < 1 || options_.servers >= n)
      throw error(errc::config, "parameter_server: " + std::to_string(options_.servers) + " server(s) in a job of " +
                                    std::to_string(n) + " ranks: a job needs at least one server and one worker "
                                    "(launch with --ps N, or a TF_CONFIG with a \"ps\" list)");
    plan<V>(params);
    std::vector<V> flat;  // setup only: the chief's values to everyone in one broadcast
    for (auto p : params) flat.insert(flat.end(), p.begin(), p.end());
    collective::broadcast(comm, std::span<V>(flat), 0);
    std::size_t at = 0;
    for (auto p : params) std::copy_n(flat.data() + at, p.size(), p.data()), at += p.size();
    if constexpr (concepts::loss_tolerant_transport<Tr>)
      if (Mode::on_arrival && concepts::tolerates_loss(comm.transport()))  // async: workers may die; servers never
        for (int r = 0; r < first_server(n); ++r)
          if (r != comm.rank()) comm.transport().tolerate_loss(r);
    if constexpr (concepts::one_sided_transport<Tr>) share_windows<V>(comm);
    if (!is_server(comm.rank(), n)) {
      auto pulled = pull(comm, params);
      pulled.wait();
    }
  }

  // A worker's step: push the gradient, pull the parameters the mode allows, wait for both.
  template <class Tr, class V, class Apply>
  void step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params,
            std::span<const std::span<const V>> grads, Apply&&) {
    if (is_server(comm.rank(), comm.size()))
      throw error(errc::invalid_argument, "parameter_server: rank " + std::to_string(comm.rank()) +
                                              " is a server: call serve() on it instead of step()");
    // On the timeline the pull nests in the push: the push is done only once it is sent.
    std::size_t model_bytes = 0;
    for (auto g : grads) model_bytes += g.size_bytes();
    auto push_trace = comm.trace("push", model_bytes, "ps");
    push_trace.arg("clock", static_cast<std::int64_t>(clock_ + 1));
    auto pushed = push(comm, grads);
    {
      auto pull_trace = comm.trace("pull", model_bytes, "ps");
      auto pulled = pull(comm, params);
      pulled.wait();
      pull_trace.arg("version", static_cast<std::int64_t>(min_version_));
    }
    pushed.wait();
    push_trace.arg("staleness", static_cast<std::int64_t>(staleness_));
  }

  // Handles of a worker's non-blocking push and pull. One of each may be in flight.
  template <class Tr>
  class push_handle {
   public:
    push_handle(collective::communicator<Tr>& comm, std::vector<typename Tr::request> sends, deadline until)
        : comm_(&comm), sends_(std::move(sends)), until_(until) {}
    void wait() {
      for (auto& r : sends_)
        if (r) wrap_server_loss([&] { comm_->transport().wait(r, until_); });
      sends_.clear();
    }

   private:
    collective::communicator<Tr>* comm_;
    std::vector<typename Tr::request> sends_;
    deadline until_;
  };

  template <class Tr, class V>
  class pull_handle {
   public:
    pull_handle(parameter_server& ps, collective::communicator<Tr>& comm, std::span<const std::span<V>> params,
                std::vector<typename Tr::request> requests, deadline until)
        : ps_(&ps), comm_(&comm), params_(params), requests_(std::move(requests)), until_(until) {}
    // Waits for every server's answer and writes the parameters into place.
    void wait() {
      for (auto& r : requests_)
        if (r) wrap_server_loss([&] { comm_->transport().wait(r, until_); });
      requests_.clear();
      if constexpr (concepts::one_sided_transport<Tr>) ps_->get_parameters(*comm_, params_, until_);
      ps_->take_replies(comm_->rank(), comm_->size(), params_);
    }

   private:
    parameter_server* ps_;
    collective::communicator<Tr>* comm_;
    std::span<const std::span<V>> params_;
    std::vector<typename Tr::request> requests_;
    deadline until_;
  };

  // Over one-sided access it returns once the gradient is in the servers' memory.
  template <class Tr, class V>
  push_handle<Tr> push(collective::communicator<Tr>& comm, std::span<const std::span<const V>> grads) {
    auto& t = comm.transport();
    const int first = first_server(comm.size());
    ++clock_;
    if constexpr (concepts::one_sided_transport<Tr>) put_gradients(comm, grads);
    std::vector<typename Tr::request> sends;
    sends.reserve(2 * static_cast<std::size_t>(options_.servers));
    for (int s = 0; s < options_.servers; ++s) {
      if (shard_elements_[static_cast<std::size_t>(s)] == 0) continue;  // a server with nothing of this model
      auto& link = links_[static_cast<std::size_t>(s)];
      const std::uint32_t flags = link.put_clock == clock_ ? ps::detail::in_window : 0;
      link.push = {ps::detail::request_kind::push, flags, link.version, clock_, link.updates};
      sends.push_back(t.async_send(first + s, ps::detail::request_tag, ps::detail::bytes_of(link.push)));
      if (flags) continue;
      V* out = reinterpret_cast<V*>(link.gradient.data());
      for (const auto& p : shard_pieces_[static_cast<std::size_t>(s)])
        out = std::copy_n(grads[p.tensor].data() + p.begin, p.size(), out);
      sends.push_back(t.async_send(first + s, ps::detail::gradient_tag,
                                   {link.gradient.data(), shard_elements_[static_cast<std::size_t>(s)] * sizeof(V)}));
    }
    return push_handle<Tr>(comm, std::move(sends), deadline_after(options_.timeout));
  }

  template <class Tr, class V>
  pull_handle<Tr, V> pull(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    auto& t = comm.transport();
    const int first = first_server(comm.size());
    std::vector<typename Tr::request> requests;
    requests.reserve(2 * static_cast<std::size_t>(options_.servers));
    for (int s = 0; s < options_.servers; ++s) {
      if (shard_elements_[static_cast<std::size_t>(s)] == 0) continue;
      auto& link = links_[static_cast<std::size_t>(s)];
      // Sync modes: the step after the one this worker's gradient went into.
      const std::uint64_t wanted = (!Mode::on_arrival && clock_ > 0) ? link.version + 1 : 0;
      link.pull = {ps::detail::request_kind::pull, link.remote ? ps::detail::in_window : 0, wanted, clock_, 0};
      const std::size_t parameters = link.remote ? 0 : shard_elements_[static_cast<std::size_t>(s)] * sizeof(V);
      requests.push_back(t.async_recv(first + s, ps::detail::reply_tag,
                                      {link.reply.data(), sizeof(ps::detail::reply_header) + parameters}));
      requests.push_back(t.async_send(first + s, ps::detail::request_tag, ps::detail::bytes_of(link.pull)));
    }
    return pull_handle<Tr, V>(*this, comm, params, std::move(requests), deadline_after(options_.timeout));
  }

  // A worker that stops training tells the servers (they stop waiting for it).
  template <class Tr>
  void finish(collective::communicator<Tr>& comm) {
    // A moved-from strategy has no links (and no transport to ask for its rank).
    if (finished_ || links_.empty() || is_server(comm.rank(), comm.size())) return;
    finished_ = true;
    auto& t = comm.transport();
    std::vector<typename Tr::request> sends;
    ps::detail::request_header done{ps::detail::request_kind::done, 0, 0, clock_, 0};
    for (int s = 0; s < options_.servers; ++s)
      sends.push_back(t.async_send(first_server(comm.size()) + s, ps::detail::request_tag, ps::detail::bytes_of(done)));
    for (auto& r : sends) t.wait(r, deadline_after(std::chrono::seconds(10)));
  }

  // A server's loop: applies gradients and answers pulls until every worker has
  // finished or was lost; then writes its final checkpoint and returns what it saw.
  template <class Tr, class V, class Optimizer>
  ps::server_stats serve(collective::communicator<Tr>& comm, std::span<const std::span<V>> params,
                         const Optimizer& optimizer);

 private:
  // Per-server buffers of a worker (and their sizes), allocated once.
  struct server_link {
    aligned_buffer<std::byte> gradient, reply;
    ps::detail::request_header push, pull;
    std::uint64_t version = 0, updates = 0;
    // One-sided access: the server's window (a Tr::remote_window), set when the transport
    // prefers it to that server; the clock of the latest gradient put there, and of the
    // latest one the server is known to have taken (a reply to a later pull): a gradient
    // goes into the window only when the one before it was taken.
    std::shared_ptr<void> remote;
    std::uint64_t put_clock = 0, taken_clock = 0;
  };

  template <class F>
  static void wrap_server_loss(F&& f) {
    try {
      f();
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
      throw error(errc::peer_lost, "parameter_server: " + e.details() +
                                       " (a parameter server or the job failed; restart the job with the same "
                                       "checkpoint directory to resume from the servers' last checkpoints)");
    }
  }

  template <class V>
  void plan(std::span<const std::span<V>> params) {
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    pieces_ = ps::partition(sizes, options_.servers, std::max<std::size_t>(1, options_.split_bytes / sizeof(V)));
    shard_pieces_.assign(static_cast<std::size_t>(options_.servers), {});
    shard_elements_.assign(static_cast<std::size_t>(options_.servers), 0);
    for (const auto& p : pieces_) {
      shard_pieces_[static_cast<std::size_t>(p.server)].push_back(p);
      shard_elements_[static_cast<std::size_t>(p.server)] += p.size();
    }
    links_.clear();
    links_.resize(static_cast<std::size_t>(options_.servers));
    window_.reset();
    for (std::size_t s = 0; s < links_.size(); ++s) {
      links_[s].gradient.reserve_discard(shard_elements_[s] * sizeof(V));
      links_[s].reply.reserve_discard(sizeof(ps::detail::reply_header) + shard_elements_[s] * sizeof(V));
    }
  }

  template <class V>
  void take_replies(int rank, int size, std::span<const std::span<V>> params) {
    std::uint64_t least = ~std::uint64_t{0}, updates = 0;
    std::uint32_t lost = 0;
    int last_lost = -1;
    staleness_ = 0;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      if (shard_elements_[s] == 0) continue;
      ps::detail::reply_header h;
      std::memcpy(&h, links_[s].reply.data(), sizeof h);
      if (!links_[s].remote) {  // one-sided: get_parameters() put them in place
        const V* in = reinterpret_cast<const V*>(links_[s].reply.data() + sizeof h);
        for (const auto& p : shard_pieces_[s]) {
          std::copy_n(in, p.size(), params[p.tensor].data() + p.begin);
          in += p.size();
        }
      }
      links_[s].taken_clock = std::max(links_[s].taken_clock, links_[s].pull.clock);
      links_[s].version = h.version;
      links_[s].updates = h.updates;
      least = std::min(least, h.version);
      updates = std::max(updates, h.applied);
      staleness_ = std::max(staleness_, h.staleness);
      if (h.lost > lost) lost = h.lost, last_lost = h.last_lost;
    }
    if (least != ~std::uint64_t{0}) min_version_ = least;
    applied_ = updates;
    if (lost > lost_ && rank == 0)
      observe::log(options_.report ? observe::log_level::warning : observe::log_level::info, rank, size,
                   "parameter_server: worker rank ", last_lost, " was lost (", lost,
                   " worker(s) lost so far); training goes on without it");
    lost_ = std::max(lost_, lost);
  }

  template <class V>
  ps::detail::window_layout layout(int server) const {
    const std::size_t elements = shard_elements_[static_cast<std::size_t>(server)];
    return {sizeof(ps::detail::reply_header) + elements * sizeof(V), elements * sizeof(V)};
  }

  // Servers expose their windows and send each worker the key (an empty one when the
  // server's transport prefers messages to every worker, so no memory is registered for
  // nothing); workers attach the windows of the servers their transport prefers
  // one-sided access to. Collective.
  template <class V, class Tr>
  void share_windows(collective::communicator<Tr>& comm) {
    namespace d = ps::detail;
    auto& t = comm.transport();
    const int n = comm.size(), me = comm.rank(), workers = first_server(n);
    const auto until = deadline_after(options_.timeout);
    if (is_server(me, n)) {
      const int server = me - workers;
      if (shard_elements_[static_cast<std::size_t>(server)] == 0) return;
      bool wanted = false;
      for (int w = 0; w < workers; ++w) wanted = wanted || t.prefers_one_sided(w);
      std::shared_ptr<typename Tr::memory_window> window;
      std::span<const std::byte> key;
      if (wanted) {
        const auto zones = layout<V>(server);
        window_memory_.reserve_discard(zones.stride() * static_cast<std::size_t>(workers));
        window = std::make_shared<typename Tr::memory_window>(
            t.expose({window_memory_.data(), zones.stride() * static_cast<std::size_t>(workers)}));
        key = window->key();
      }
      const std::uint64_t key_size = key.size();
      std::vector<typename Tr::request> sends;
      for (int w = 0; w < workers; ++w) {
        sends.push_back(t.async_send(w, d::window_size_tag, d::bytes_of(key_size)));
        if (!key.empty()) sends.push_back(t.async_send(w, d::window_key_tag, key));
      }
      for (auto& r : sends) t.wait(r, until);
      window_ = std::move(window);
      return;
    }
    for (int s = 0; s < options_.servers; ++s) {
      if (shard_elements_[static_cast<std::size_t>(s)] == 0) continue;
      std::uint64_t key_size = 0;
      auto size_message = t.async_recv(workers + s, d::window_size_tag, d::writable_bytes_of(key_size));
      wrap_server_loss([&] { t.wait(size_message, until); });
      auto& link = links_[static_cast<std::size_t>(s)];
      link.remote.reset();
      if (key_size == 0) continue;  // the server has no window: messages only
      if (key_size > (std::uint64_t{1} << 20))
        throw error(errc::protocol, "parameter_server: server rank " + std::to_string(workers + s) +
                                        " sent a window key of " + std::to_string(key_size) + " bytes");
      std::vector<std::byte> key(key_size);
      auto key_message = t.async_recv(workers + s, d::window_key_tag, key);
      wrap_server_loss([&] { t.wait(key_message, until); });
      if (!t.prefers_one_sided(workers + s)) continue;
      auto remote = std::make_shared<typename Tr::remote_window>(t.attach(workers + s, key));
      if (remote->size() < layout<V>(s).stride() * static_cast<std::size_t>(workers))
        throw error(errc::mismatch, "parameter_server: server rank " + std::to_string(workers + s) +
                                        "'s window is smaller than this model's shard needs: do all ranks train "
                                        "the same model?");
      link.remote = std::move(remote);
    }
  }

  // Puts this worker's gradient into the windows of the servers that took the one
  // before it, straight from the gradient tensors, and waits until it is there.
  template <class Tr, class V>
  void put_gradients(collective::communicator<Tr>& comm, std::span<const std::span<const V>> grads) {
    auto& t = comm.transport();
    const auto until = deadline_after(options_.timeout);
    std::vector<typename Tr::request> puts;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      auto& link = links_[s];
      if (!link.remote || shard_elements_[s] == 0 || link.taken_clock < link.put_clock) continue;
      auto& remote = *std::static_pointer_cast<typename Tr::remote_window>(link.remote);
      std::size_t at = layout<V>(static_cast<int>(s)).gradient(comm.rank());
      for (const auto& p : shard_pieces_[s]) {
        puts.push_back(t.async_put(remote, at, std::as_bytes(grads[p.tensor].subspan(p.begin, p.size()))));
        at += p.size() * sizeof(V);
      }
      link.put_clock = clock_;
    }
    for (auto& r : puts) wrap_server_loss([&] { t.wait(r, until); });
  }

  // After the servers' reply headers: gets each shard's parameters from the windows
  // straight into the parameter tensors.
  template <class Tr, class V>
  void get_parameters(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, deadline until) {
    auto& t = comm.transport();
    std::vector<typename Tr::request> gets;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      auto& link = links_[s];
      if (!link.remote || shard_elements_[s] == 0) continue;
      auto& remote = *std::static_pointer_cast<typename Tr::remote_window>(link.remote);
      std::size_t at = layout<V>(static_cast<int>(s)).reply(comm.rank()) + sizeof(ps::detail::reply_header);
      for (const auto& p : shard_pieces_[s]) {
        gets.push_back(t.async_get(remote, at, std::as_writable_bytes(params[p.tensor].subspan(p.begin, p.size()))));
        at += p.size() * sizeof(V);
      }
    }
    for (auto& r : gets) wrap_server_loss([&] { t.wait(r, until); });
  }

  ps::options options_;
  std::vector<ps::piece> pieces_;
  std::vector<std::vector<ps::piece>> shard_pieces_;  // [server], in (tensor, begin) order
  std::vector<std::size_t> shard_elements_;           // [server]
  std::vector<server_link> links_;                    // [server]; workers only use them
  std::uint64_t clock_ = 0;                           // this worker's pushes
  std::uint64_t min_version_ = 0, applied_ = 0, staleness_ = 0;
  std::uint32_t lost_ = 0;
  bool finished_ = false;
  // A server's window (a Tr::memory_window over window_memory_), when its transport has one-sided access.
  aligned_buffer<std::byte> window_memory_;
  std::shared_ptr<void> window_;
};

}  // namespace aggregation
}  // namespace gradwire

#include "detail/parameter_server_serve.hpp"
