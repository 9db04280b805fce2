// transport::simulated: N ranks of the user's real code in virtual time, on a modelled cluster (transport/simulated/).
//
//   simulation::cluster_model model = simulation::parse_cluster_model("hosts=25 ranks_per_host=4 bandwidth=10Gbit");
//   simulation::run(model, [&](transport::simulated t) {    // one thread per rank, one at a time
//     gradwire::strategy<..., transport::simulated> s(std::move(t), params, optimizer);
//     ... s.step(grads); simulation::compute(2ms) ...
//   });
//
// The endpoint models the transport concept and the optional capabilities the library's
// strategies use: accumulating receives, fail, wait_any (in virtual arrival order: the
// parameter server sees requests as a real one would), loss tolerance, traffic counts and
// the topology of the modelled hosts. It does not claim a shared address space: the
// ranks stand for processes. What a rank computes is real (gradients, accuracy); only time
// is modelled: simulated/scheduler.hpp says how, simulated/network.hpp how messages take
// time, and simulated/cluster_model.hpp what can be set. Traces (GRADWIRE_TIMELINE) and
// step stats are in virtual time; a simulated job's timeline opens like a real one.
//
// Beside the other transports as transport/inproc.hpp is beside inproc/: this header and its
// pieces under simulated/ (cluster_model, network, mailbox, scheduler). Their namespace is
// gradwire::simulation, not the folder's: transport::simulated is the endpoint's type, so it
// cannot also be a namespace, and a job's run, compute and now are not transport names
// (docs/simulation.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../support/topology.hpp"
#include "../timeouts.hpp"
#include "detail/messages.hpp"
#include "detail/pending_request.hpp"
#include "detail/failure.hpp"
#include "detail/rank_runner.hpp"
#include "simulated/cluster_model.hpp"
#include "simulated/scheduler.hpp"

namespace gradwire::simulation {

// One simulated rank's endpoint (transport::simulated). Cheap to move; it belongs to the
// rank's thread that run() gave it to.
class endpoint {
 public:
  using request = transport::detail::pending_request<detail::scheduler, detail::sim_op>;

  endpoint(std::shared_ptr<detail::scheduler> scheduler, int rank)
      : scheduler_(std::move(scheduler)), rank_(rank) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return scheduler_->size(); }
  // This rank's virtual clock (concepts::timed_transport): what its deadlines, step stats,
  // traces and background collectives are timed with.
  time_source time() const noexcept { return time_source(scheduler_->state(rank_)); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    // The sender's buffer is only read (copied from).
    return post(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size(), transport::detail::deliver_copy);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    return post(false, peer, tag, bytes.data(), bytes.size(), transport::detail::deliver_copy);
  }
  // inout[i] += message[i] as the message is delivered (concepts::accumulating_transport).
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return post(false, peer, tag, reinterpret_cast<std::byte*>(inout.data()), inout.size_bytes(),
                &transport::detail::deliver_accumulate<V>);
  }

  void wait(request& r, deadline until) { transport::detail::finish_operation(*scheduler_, r, until, "simulated"); }

  // The request that completes first in virtual time; wait() then finishes it at once.
  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    ops_.clear();
    for (request* r : requests) ops_.push_back(r ? const_cast<detail::sim_op*>(r->peek()) : nullptr);
    const detail::call_end done(*scheduler_, rank_);
    return scheduler_->wait_any(rank_, ops_, until);
  }

  // This rank failed: its peers learn it one latency later (concepts::failable_transport).
  void fail(errc cause, const std::string& reason) { scheduler_->fail(rank_, cause, reason); }

  // Survive the loss of `peer` (concepts::loss_tolerant_transport).
  void tolerate_loss(int peer) {
    transport::detail::check_peer("simulated", rank_, peer, size());
    scheduler_->tolerate_loss(rank_, peer);
  }
  // After losing `peer`, take back its replacement (the model's restart=): receives posted
  // from it meanwhile wait for the replacement (concepts::rejoinable_transport).
  void allow_rejoin(int peer) {
    transport::detail::check_peer("simulated", rank_, peer, size());
    scheduler_->allow_rejoin(rank_, peer);
  }
  // Whether this is a replacement of its rank (restart=): it must not take part in what the
  // others ran at the start.
  bool rejoined() const noexcept { return scheduler_->state(rank_).rejoined; }
  std::vector<int> lost_peers() const { return scheduler_->lost_peers(rank_); }
  // A simulated rank is lost only when it dies or fails: always gone for sure.
  std::vector<int> gone_peers() const { return lost_peers(); }

  support::traffic_counters traffic() const noexcept { return scheduler_->state(rank_).traffic; }

  // The modelled hosts (cluster_model::hosts x ranks_per_host).
  const cluster::topology& topology() const noexcept { return scheduler_->topology(); }

  // This rank's virtual clock (the compute it has done counted).
  time_point now() const { return duration(scheduler_->state(rank_).now_ns()); }

 private:
  request post(bool is_send, int peer, std::uint64_t tag, std::byte* data, std::size_t bytes,
               transport::detail::deliver_fn deliver) {
    transport::detail::check_peer("simulated", rank_, peer, size());
    scheduler_->begin_call(rank_, is_send ? scheduler_->model().overhead : duration{});
    auto op = transport::detail::make_operation<detail::sim_op>(is_send, rank_, peer, tag, data, bytes, deliver);
    const detail::call_end done(*scheduler_, rank_);
    return transport::detail::start_operation(scheduler_, std::move(op), [&](detail::sim_op& o) {
      is_send ? scheduler_->post_send(o) : scheduler_->post_recv(o);
    });
  }

  std::shared_ptr<detail::scheduler> scheduler_;
  int rank_;
  std::vector<detail::sim_op*> ops_;  // wait_any's, reused
};

// What a simulated run took, in virtual time.
struct run_report {
  time_point end{};                 // the last rank's clock when it finished
  std::vector<time_point> rank_end;  // each rank's
  std::vector<int> died;            // ranks that died as the model said
};

// A simulated job: the model's ranks, each running fn(endpoint) on a thread of its own,
// one at a time in virtual-time order (scheduler.hpp).
class job {
 public:
  explicit job(cluster_model model) : scheduler_(std::make_shared<detail::scheduler>(std::move(model))) {}

  int size() const noexcept { return scheduler_->size(); }
  const cluster_model& model() const noexcept { return scheduler_->model(); }

  // Runs fn on every rank; returns each rank's outcome (null on success or a modelled
  // death). A rank that throws is lost to the others, as on a real transport. Once per job.
  template <class Fn>
  std::vector<std::exception_ptr> run(Fn&& fn, run_report* report = nullptr) {
    if (ran_) throw error(errc::invalid_argument, "simulation::job::run: a job runs once; make a new job to run again");
    ran_ = true;
    const int n = size();
    std::vector<char> died(static_cast<std::size_t>(n), 0);
    baton hooks{{}, scheduler_.get(), &died};
    std::vector<std::exception_ptr> outcomes = transport::detail::run_ranks(
        n,
        [&](int r) {
          for (;;) {
            try {
              fn(endpoint(scheduler_, r));
              return;
            } catch (const rank_died&) {  // the model's death, not the rank's failure
              died[static_cast<std::size_t>(r)] = 1;
            }
            if (!scheduler_->restart(r)) return;  // restart=: its replacement runs fn again
          }
        },
        hooks);
    if (report) {
      report->rank_end.clear();
      report->died.clear();
      report->end = {};
      for (int r = 0; r < n; ++r) {
        report->rank_end.push_back(scheduler_->state(r).clock);
        report->end = std::max(report->end, scheduler_->state(r).clock);
        if (died[static_cast<std::size_t>(r)]) report->died.push_back(r);
      }
    }
    return outcomes;
  }

 private:
  // The scheduler's side of each rank's thread: one rank runs at a time (enter, leave hand
  // the baton on), a rank that threw is lost to its peers, and a job whose threads did not
  // all start lets those that did return at once.
  struct baton : transport::detail::rank_hooks {
    detail::scheduler* s;
    std::vector<char>* died;
    bool enter(int r) {
      if (!s->enter(r)) return false;
      detail::this_thread_rank() = &s->state(r);
      return true;
    }
    void leave(int r, std::optional<transport::detail::rank_failure> failure) {
      detail::this_thread_rank() = nullptr;
      if (s->leave(r, std::move(failure))) (*died)[static_cast<std::size_t>(r)] = 1;
    }
    void started() {
      s->start();
      s->join_all();
    }
    void start_failed(int started) { s->abort_start(started); }
  };

  std::shared_ptr<detail::scheduler> scheduler_;
  bool ran_ = false;
};

// Runs fn(endpoint) on every rank of `model` and rethrows the root cause if a rank failed
// (the first failure that is not a consequence, peer_lost, of another's), as
// transport::run_inproc does. Returns the run's virtual times.
template <class Fn>
run_report run(cluster_model model, Fn&& fn) {
  job j(std::move(model));
  run_report report;
  transport::detail::rethrow_root_cause(j.run(std::forward<Fn>(fn), &report));
  return report;
}

// Modelled work on the calling simulated rank: its clock advances by `d` times its speed
// factors (cluster_model speed, slow=, this step's straggler draw). On other threads, nothing.
inline void compute(duration d) {
  if (d.count() < 0)
    throw error(errc::invalid_argument, "simulation::compute: a duration >= 0, got " + std::to_string(d.count()) + " ns");
  if (detail::rank_state* s = detail::this_thread_rank()) {
    s->charge_compute();
    s->clock += s->stretched(d);
  }
}

// The calling simulated rank's virtual time (zero on other threads).
inline time_point now() {
  if (detail::rank_state* s = detail::this_thread_rank()) return duration(s->now_ns());
  return {};
}

// Whether the calling thread is a simulated rank.
inline bool simulated() noexcept { return detail::this_thread_rank() != nullptr; }

}  // namespace gradwire::simulation

namespace gradwire::transport {
// The simulated transport: simulation::endpoint, which this header runs (simulation::run).
using simulated = simulation::endpoint;
}  // namespace gradwire::transport

namespace gradwire::simulation {
static_assert(concepts::transport<endpoint>);
static_assert(concepts::accumulating_transport<endpoint, float> && concepts::accumulating_transport<endpoint, double>);
static_assert(concepts::failable_transport<endpoint> && concepts::multiplexing_transport<endpoint>);
static_assert(concepts::loss_tolerant_transport<endpoint> && concepts::metered_transport<endpoint>);
static_assert(concepts::topology_aware_transport<endpoint>);
static_assert(concepts::timed_transport<endpoint>);  // its virtual clock
static_assert(concepts::rejoinable_transport<endpoint>);  // the model's restart=
}  // namespace gradwire::simulation
