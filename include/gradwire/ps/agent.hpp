// One rank's part in a parameter-server job (the agent strategy<> builds for aggregation::parameter_server).
//
// Setup makes every rank start from the chief's parameters, works out the sharding, and
// sets up one-sided windows where the transport has them. Then a worker rank steps
// (begin_step / ready / finish_step, through ps::worker: each server's shard is pushed as
// soon as its tensors are ready) and a server rank serves (ps::server) until the workers
// are done.
//
// With a codec (aggregation::parameter_server<Mode, Codec>) the workers' pushes go through
// it (push_codec.hpp); setup first checks that every rank lays pushes out as the chief does.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <system_error>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../aggregation/no_codec.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/flat_layout.hpp"
#include "options.hpp"
#include "push_codec.hpp"
#include "server.hpp"
#include "sharding.hpp"
#include "stats.hpp"
#include "step_rule.hpp"
#include "windows.hpp"
#include "worker.hpp"

namespace gradwire::ps {

// Mode: concepts::ps_mode; V: the parameters' value type; Tr: a transport with wait_any
// (concepts::multiplexing_transport), so that a server answers workers in arrival order;
// Codec: aggregation::no_codec, or the concepts::compressor<Codec, V> the pushes go through.
template <concepts::ps_mode Mode, class V, class Tr, class Codec = aggregation::no_codec>
class agent {
  static constexpr bool compressed = !std::is_same_v<Codec, aggregation::no_codec>;
  static_assert(!compressed || concepts::compressor<Codec, V>,
                "aggregation::parameter_server<Mode, Codec>: Codec does not satisfy gradwire::concepts::compressor for "
                "this value type (kind, state<V>, init<V>(n), encoded_bytes<V>(n), encode(state, in, out), decode, "
                "decode_add; see concepts.hpp and gradwire/compress/)");

 public:
  using mode = Mode;
  using value_type = V;
  using transport_type = Tr;
  using codec_type = Codec;
  using communicator_type = collective::communicator<Tr>;
  using push_handle = typename worker<Mode, V, Tr, Codec>::push_handle;
  using pull_handle = typename worker<Mode, V, Tr, Codec>::pull_handle;

  explicit agent(ps::options o, Codec codec = Codec()) : options_(std::move(o)), codec_(std::move(codec)) {}
  // From the policy (aggregation::parameter_server<Mode, Codec>): its options, and its codec.
  template <class Policy>
    requires(!std::same_as<std::remove_cvref_t<Policy>, agent>) &&
            requires(const Policy& p) { { p.options() } -> std::convertible_to<const ps::options&>; }
  explicit agent(const Policy& policy) : agent(policy.options(), codec_of(policy)) {}

  const ps::options& options() const noexcept { return options_; }
  int servers() const noexcept { return options_.servers; }
  // Servers and their standbys (options::standby) are the last ranks.
  bool is_server(int rank, int size) const noexcept { return rank >= first_server(size); }
  int first_server(int size) const noexcept { return size - options_.serving_ranks(); }

  // A worker's view, from its latest answers (0 on a server): the servers' least version,
  // their most gradients applied, the workers lost so far, and the staleness of its latest
  // gradient (the servers' version when it arrived minus the version it was computed on;
  // the largest over servers; 0 in sync modes).
  std::uint64_t version() const noexcept { return worker_ ? worker_->version() : 0; }
  std::uint64_t applied() const noexcept { return worker_ ? worker_->applied() : 0; }
  std::uint32_t lost_workers() const noexcept { return worker_ ? worker_->lost_workers() : 0; }
  std::uint64_t last_staleness() const noexcept { return worker_ ? worker_->last_staleness() : 0; }
  // A worker's servers that failed over to their standby so far (ps::options::standby).
  int failovers() const noexcept { return worker_ ? worker_->failovers() : 0; }

  // Collective: every rank starts from the chief's parameters (rank 0, a worker); servers
  // expose their windows; then each worker pulls from the servers, which may have resumed
  // from a checkpoint. A worker's replacement process (a rejoinable transport that
  // rejoined) only pulls: the servers take it back (async modes).
  void setup(communicator_type& comm, std::span<const std::span<V>> params) {
    static_assert(concepts::multiplexing_transport<Tr>,
                  "aggregation::parameter_server needs a transport with wait_any (asio_tcp, ucx, inproc)");
    const int n = comm.size(), me = comm.rank();
    rank_ = me;
    if (options_.servers < 1 || options_.serving_ranks() >= n)
      throw error(errc::config, "parameter_server: " + std::to_string(options_.servers) + " server(s)" +
                                    (options_.standby ? " and as many standbys" : "") + " in a job of " +
                                    std::to_string(n) + " ranks: a job needs at least one server and one worker "
                                    "(launch with --ps N, or a TF_CONFIG with a \"ps\" list; with standbys, N is "
                                    "twice the servers)");
    check_standby(comm);
    // b backups of W workers: a step closes after W - b gradients, so b >= W would make
    // steps of one gradient (the server's floor) where the user asked for a synchronous mode.
    if (Mode::backups > 0 && Mode::backups >= first_server(n))
      throw error(errc::config, "parameter_server: ps::backup_workers<" + std::to_string(Mode::backups) + "> in a job of " +
                                    std::to_string(first_server(n)) + " worker(s): a step closes after the first " +
                                    "workers - b gradients, so b must be below the number of workers");
    if (options_.timeout.count() <= 0)
      throw error(errc::config, "parameter_server: ps::options::timeout = " + std::to_string(options_.timeout.count()) +
                                    " ms: it must be positive (how long a server waits for any worker)");
    // A checkpoint directory that cannot be made fails now, on the server that needs it,
    // not as a filesystem exception when the server first saves.
    if (is_server(me, n) && !options_.checkpoint_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(options_.checkpoint_dir, ec);
      if (ec)
        throw error(errc::config, "parameter_server: ps::options::checkpoint_dir '" + options_.checkpoint_dir.string() +
                                      "' cannot be created (" + ec.message() + "): choose a writable directory");
    }
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    shards_ = sharding(sizes, options_.servers, std::max<std::size_t>(1, options_.split_bytes / sizeof(V)));
    if (rejoining(comm, me, n)) {  // a worker's replacement: the job is running; pull and go on
      worker_.emplace(options_, shards_, first_server(n), codec_);
      try {
        worker_->pull(comm, params).wait();
      } catch (const error& e) {
        throw error(e.kind(), "parameter_server: this replacement of worker rank " + std::to_string(me) +
                                  " could not rejoin the running job (the job goes on without it): " + e.details());
      }
      return;
    }
    broadcast_chiefs(comm, params);
    if constexpr (compressed) check_codec(comm);
    if constexpr (concepts::loss_tolerant_transport<Tr>)
      if (options_.standby)  // a server or a standby may be lost: the others go on
        for (int r = first_server(n); r < n; ++r)
          if (r != me) comm.transport().tolerate_loss(r);
    // Async modes: workers may die (servers drop them: membership.hpp); servers never.
    if constexpr (concepts::loss_tolerant_transport<Tr>)
      if (step_rule<Mode>::drops_lost_workers && concepts::tolerates_loss(comm.transport()))
        for (int r = 0; r < first_server(n); ++r) {
          if (r == me) continue;
          // Servers also take a lost worker's replacement back (elastic workers).
          if constexpr (concepts::rejoinable_transport<Tr>)
            if (is_server(me, n)) {
              comm.transport().allow_rejoin(r);
              continue;
            }
          comm.transport().tolerate_loss(r);
        }
    if (is_server(me, n)) {
      if constexpr (concepts::one_sided_transport<Tr>) {  // servers only: workers reach standbys by message
        const int s = me - first_server(n);
        if (s < options_.servers && shards_.elements(s) > 0) {
          const auto until = comm.time().deadline_after(options_.timeout);
          if constexpr (compressed)  // its gradient zones hold payloads
            window_ = server_window<V, Tr>::expose(comm, shards_.elements(s), first_server(n), until,
                                                   detail::payload_offsets<V>(codec_, shards_.shard(s)).back());
          else
            window_ = server_window<V, Tr>::expose(comm, shards_.elements(s), first_server(n), until);
        }
      }
      return;
    }
    worker_.emplace(options_, shards_, first_server(n), codec_);
    if constexpr (concepts::one_sided_transport<Tr>) worker_->attach_windows(comm);
    worker_->pull(comm, params).wait();
  }

  // --- a worker's step (concepts::aggregation_agent) -------------------------------

  void begin_step(communicator_type& comm) { worker_for("step").begin_step(comm); }
  // The servers whose tensors are now all ready get their push at once, from this thread.
  void ready(communicator_type& comm, std::size_t i, std::span<const V> grad) { worker_for("step").ready(comm, i, grad); }
  // Pulls the parameters into `params`: the servers applied the update, so `apply` is not called.
  template <class Apply>
  void finish_step(communicator_type& comm, std::span<const std::span<V>> params, Apply&&) {
    worker_for("step").finish_step(comm, params);
  }

  // The same by hand, to overlap with compute: the whole gradient at once, and the
  // parameters; wait() on the handles (one of each in flight).
  push_handle push(communicator_type& comm, std::span<const std::span<const V>> grads) {
    return worker_for("push").push(comm, grads);
  }
  pull_handle pull(communicator_type& comm, std::span<const std::span<V>> params) {
    return worker_for("pull").pull(comm, params);
  }

  // A worker that stops training tells the servers (strategy<>'s destructor calls it).
  void finish(communicator_type& comm) {
    if (worker_) worker_->finish(comm);
  }

  // A server's loop: applies gradients and answers pulls until every worker has finished
  // or was lost; then writes its final checkpoint and returns what it saw.
  template <class Optimizer>
  server_stats serve(communicator_type& comm, std::span<const std::span<V>> params, const Optimizer& optimizer) {
    return serve_with(comm, params, optimizer, {});
  }
  // The same, running a learning-rate schedule: before each update, lr = schedule(version,
  // gradients applied so far). Only for an optimizer whose rate can be set
  // (concepts::scheduling_agent).
  template <concepts::schedulable_optimizer Optimizer, std::invocable<std::uint64_t, std::uint64_t> Schedule>
  server_stats serve(communicator_type& comm, std::span<const std::span<V>> params, const Optimizer& optimizer,
                     Schedule schedule) {
    return serve_with(comm, params, optimizer, learning_rate_schedule(std::move(schedule)));
  }

 private:
  template <class Optimizer>
  server_stats serve_with(communicator_type& comm, std::span<const std::span<V>> params, const Optimizer& optimizer,
                          learning_rate_schedule schedule) {
    if (!is_server(comm.rank(), comm.size()))
      throw error(errc::invalid_argument, "parameter_server: rank " + std::to_string(comm.rank()) +
                                              " is a worker: serve() is for the server ranks (the last " +
                                              std::to_string(options_.serving_ranks()) + ")");
    return server<Mode, V, Tr, Optimizer, Codec>(comm, params, optimizer, options_, shards_, window_,
                                                 std::move(schedule), codec_)
        .run();
  }

  template <class Policy>
  static Codec codec_of(const Policy& policy) {
    if constexpr (compressed)
      return policy.codec();
    else
      return {};
  }

  // Setup, with a codec: every rank lays pushes out as the chief does (the codec's and the
  // value's types, each server's payload bytes: push_fingerprint), or every rank stops here
  // with errc::mismatch naming the first rank that differs, before a payload is decoded by
  // other rules than it was encoded by. Each rank sends the chief its fingerprint; the chief
  // broadcasts which differ (rank + 1, and how many: exact in V).
  void check_codec(communicator_type& comm) const {
    auto& t = comm.transport();
    const int n = comm.size();
    const auto until = comm.time().deadline_after(options_.timeout);
    std::uint64_t mine = detail::push_fingerprint<V>(codec_, shards_);
    V verdict[2] = {V(0), V(0)};  // the first rank that differs + 1 (0: none), how many differ
    if (comm.rank() == 0) {
      std::vector<std::uint64_t> theirs(static_cast<std::size_t>(n), mine);
      std::vector<typename Tr::request> receives;
      for (int r = 1; r < n; ++r)
        receives.push_back(t.async_recv(r, detail::codec_check_tag, detail::writable_bytes_of(theirs[std::size_t(r)])));
      for (auto& r : receives) t.wait(r, until);
      for (int r = n - 1; r > 0; --r)
        if (theirs[std::size_t(r)] != mine) verdict[0] = static_cast<V>(r + 1), verdict[1] += V(1);
    } else {
      auto sent = t.async_send(0, detail::codec_check_tag, detail::bytes_of(mine));
      t.wait(sent, until);
    }
    collective::broadcast(comm, std::span<V>(verdict), 0);
    if (verdict[0] == V(0)) return;
    const auto first = static_cast<long long>(verdict[0]) - 1, others = static_cast<long long>(verdict[1]) - 1;
    std::string sizes;
    for (int s = 0; s < shards_.servers(); ++s)
      sizes += (s ? ", " : "") + std::to_string(detail::payload_offsets<V>(codec_, shards_.shard(s)).back());
    throw error(errc::mismatch, "parameter_server: rank " + std::to_string(first) +
                                    (others > 0 ? " (and " + std::to_string(others) + " other rank(s))" : "") +
                                    " pushes through another codec or other codec settings than the chief (rank 0): "
                                    "every rank must build aggregation::parameter_server<Mode, Codec> with the same "
                                    "codec, codec settings and ps::options (rank " + std::to_string(comm.rank()) +
                                    ": codec " + detail::codec_name<Codec>() + ", payloads of " + sizes +
                                    " bytes to the servers)");
  }

  worker<Mode, V, Tr, Codec>& worker_for(const char* what) {
    if (worker_) return *worker_;
    if (rank_ < 0)
      throw error(errc::invalid_argument, std::string("parameter_server: ") + what +
                                              " before setup (strategy<> sets its aggregation up when it is built)");
    throw error(errc::invalid_argument, "parameter_server: rank " + std::to_string(rank_) + " is a server: call serve() "
                                        "on it instead of step() (" + what + " is for the workers)");
  }

  static constexpr std::uint32_t max_standby_lag = 1024;
  // Standbys need a transport that survives a lost peer (the server they replace).
  void check_standby(communicator_type& comm) const {
    if (!options_.standby) return;
    if (options_.standby_lag < 1 || options_.standby_lag > max_standby_lag)
      throw error(errc::config, "parameter_server: ps::options::standby_lag = " + std::to_string(options_.standby_lag) +
                                    ": it must be from 1 (a standby trails its server by the update in flight) to " +
                                    std::to_string(max_standby_lag) + " (each is a shard-sized buffer on the server)");
    if (!concepts::tolerates_loss(comm.transport()))
      throw error(errc::config, "parameter_server: ps::options::standby needs a transport that survives a lost peer "
                                "(asio_tcp, ucx); this one ends the job when a rank is lost");
  }

  // Whether this process replaces a lost worker of a running asynchronous job (its
  // transport joined with rejoin); only such a worker may.
  bool rejoining(communicator_type& comm, int me, int n) const {
    if constexpr (concepts::rejoinable_transport<Tr>) {
      if (!comm.transport().rejoined()) return false;
      if (!step_rule<Mode>::drops_lost_workers || is_server(me, n))
        throw error(errc::config, "parameter_server: rank " + std::to_string(me) + " joined as a replacement "
                                  "(GRADWIRE_REJOIN=1), but only a worker of an asynchronous parameter server (async, "
                                  "bounded staleness) can rejoin a running job; restart the whole job instead");
      return true;
    } else {
      return false;
    }
  }

  // Setup only: the chief's values to everyone in one broadcast.
  static void broadcast_chiefs(communicator_type& comm, std::span<const std::span<V>> params) {
    const flat_layout layout = flat_layout::of(params);
    std::vector<V> flat(layout.total());
    layout.gather(params, std::span<V>(flat));
    collective::broadcast(comm, std::span<V>(flat), 0);
    layout.scatter(std::span<const V>(flat), params);
  }

  ps::options options_;
  int rank_ = -1;                           // this rank, once set up
  sharding shards_;                         // the same on every rank
  server_window<V, Tr> window_;             // a server's, when its transport has one-sided access
  std::optional<worker<Mode, V, Tr, Codec>> worker_;  // a worker rank's links and step, after setup
  [[no_unique_address]] Codec codec_;  // the pushes' (none: aggregation::no_codec)
};

}  // namespace gradwire::ps
