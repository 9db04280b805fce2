// What the parameter-server test TUs share (test_parameter_server.cpp and
// test_parameter_server_agent.cpp): the model and its data, runs of a parameter-server job
// and of mirrored on threads, and the test's own records of the workers' steps and of the
// servers' traffic (step_counts, server_log, watched_inproc).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <gradwire/gradwire.hpp>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/least_squares.hpp"
#include "helpers/reference.hpp"

namespace gradwire::test::parameter_server_support {

namespace gw = gradwire;
using gw::testing::batch_data;
using gw::testing::least_squares;
using gradwire::test::require_close_to_largest;  // two float64 computations of the same sums
using gradwire::test::require_trajectories_close;

inline const least_squares model{7, 3, 4};

template <class T>
std::vector<gw::host_tensor<T>> start_params(int rank) {
  std::vector<gw::host_tensor<T>> p;
  p.emplace_back(gw::shape{model.outputs * model.inputs});
  p.emplace_back(gw::shape{model.outputs});
  for (std::size_t i = 0; i < p[0].size(); ++i) p[0][i] = rank == 0 ? T(0.1 * std::sin(double(i))) : T(50);
  for (std::size_t i = 0; i < p[1].size(); ++i) p[1][i] = rank == 0 ? T(0.05 * double(i)) : T(-50);
  return p;
}

// [step][worker] batches from one seed.
inline std::vector<std::vector<batch_data>> make_batches(int steps, int workers, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<batch_data>> d(steps);
  for (auto& s : d)
    for (int w = 0; w < workers; ++w) s.push_back(model.random_batch(gen));
  return d;
}

// Batches whose targets a linear model can fit: y = A x + c + small noise, so the loss
// of converged training is far below the starting loss.
inline std::vector<std::vector<batch_data>> make_teacher_batches(int steps, int workers, std::uint64_t seed) {
  auto d = make_batches(steps, workers, seed);
  std::mt19937_64 gen(seed ^ 0x5eed);
  std::normal_distribution<double> dist;
  std::vector<double> a(model.outputs * model.inputs), c(model.outputs);
  for (auto& v : a) v = dist(gen);
  for (auto& v : c) v = dist(gen);
  for (auto& step : d)
    for (auto& b : step) model.fit_targets(b, a, c, 0.01, gen);
  return d;
}

template <class T>
std::vector<T> flat(std::span<const gw::host_tensor<T>> p) {
  std::vector<T> out;
  for (const auto& t : p) out.insert(out.end(), t.data(), t.data() + t.size());
  return out;
}

inline gw::ps::options small_shards(int servers) {
  gw::ps::options o;
  o.servers = servers;
  o.split_bytes = 8;  // split every tensor of more than 2 floats: exercises split pieces
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Trains `steps` synchronous steps; returns the chief's parameters after every step.
template <class T, class Mode, class O>
std::vector<std::vector<T>> train_ps(int workers, int servers, O opt, const std::vector<std::vector<batch_data>>& data,
                                     gw::ps::options options, std::vector<gw::ps::server_stats>* stats = nullptr) {
  using S = gw::parameter_server<gw::host_tensor<T>, O, Mode>;
  options.servers = servers;
  std::vector<std::vector<T>> history(data.size());
  std::mutex m;
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<T>(me), opt, typename S::aggregation_type(options));
    if (s.is_server()) {
      auto st = s.serve();
      std::lock_guard lock(m);
      if (stats) stats->push_back(st);
      return;
    }
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<T>(p[0].data(), p[1].data(), data[k][me]));
      if (me == 0) history[k] = flat<T>(s.parameters());
    }
  });
  return history;
}

template <class T, class O>
std::vector<std::vector<T>> train_mirrored(int workers, O opt, const std::vector<std::vector<batch_data>>& data) {
  std::vector<std::vector<T>> history(data.size());
  gw::transport::run_inproc(workers, [&](gw::transport::inproc t) {
    gw::mirrored<gw::host_tensor<T>, O> s(t, start_params<T>(t.rank()), opt);
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<T>(p[0].data(), p[1].data(), data[k][t.rank()]));
      if (t.rank() == 0) history[k] = flat<T>(s.parameters());
    }
  });
  return history;
}

inline double loss(std::span<const float> p, const std::vector<batch_data>& eval) {
  double sum = 0;
  for (const auto& d : eval)
    for (std::size_t n = 0; n < model.batch; ++n)
      for (std::size_t o = 0; o < model.outputs; ++o) {
        double r = p[model.outputs * model.inputs + o] - d.y[n * model.outputs + o];
        for (std::size_t i = 0; i < model.inputs; ++i) r += p[o * model.inputs + i] * d.x[n * model.inputs + i];
        sum += 0.5 * r * r;
      }
  return sum / double(eval.size() * model.batch);
}

// --- test-owned records and synchronisation -------------------------------------------

// How long a test waits for a state it set up before it fails the run (throwing on the
// waiting rank, so that every rank stops instead of hanging). When the library works,
// each wait is over in milliseconds.
constexpr auto hold_limit = std::chrono::seconds(20);

// Steps started and finished per worker, counted by the test (not by the servers): a
// worker calls start(w) before step() and finish(w) once it returned. wait() blocks,
// without sleeping, until a condition on the counts holds.
class step_counts {
 public:
  using counts = std::vector<std::uint64_t>;
  struct snapshot {
    counts started, finished;
  };
  explicit step_counts(int workers) : started_(std::size_t(workers), 0), finished_(std::size_t(workers), 0) {}

  // Every worker is set up (its strategy built: the setup's pull answered) before any
  // steps, so that no setup pull is answered after another worker's first gradient.
  void set_up() {
    update([&] { ++set_up_; });
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, hold_limit, [&] { return set_up_ == started_.size(); }))
      throw std::runtime_error("test schedule: waited " + std::to_string(hold_limit.count()) + " s for every worker's setup");
  }
  void start(int w) { update([&] { ++started_[std::size_t(w)]; }); }
  void finish(int w) { update([&] { ++finished_[std::size_t(w)]; }); }
  snapshot now() const {
    std::lock_guard lock(m_);
    return {started_, finished_};
  }
  // Pred: bool(const counts& started, const counts& finished).
  template <class Pred>
  snapshot wait(Pred pred, const std::string& what) {
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, hold_limit, [&] { return pred(started_, finished_); }))
      throw std::runtime_error("test schedule: waited " + std::to_string(hold_limit.count()) + " s for " + what);
    return {started_, finished_};
  }

 private:
  template <class F>
  void update(F f) {
    {
      std::lock_guard lock(m_);
      f();
    }
    cv_.notify_all();
  }
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::size_t set_up_ = 0;
  counts started_, finished_;
};

inline std::uint64_t min_of(const std::vector<std::uint64_t>& v) { return *std::min_element(v.begin(), v.end()); }
inline std::uint64_t sum_of(const std::vector<std::uint64_t>& v) { return std::accumulate(v.begin(), v.end(), std::uint64_t{0}); }

// What one server rank's transport carried, recorded by watched_inproc below: the test's
// own account of the server's traffic, against which the consistency modes are checked
// (not the server's counters, which its gates use). Per worker: control receives the
// server posted (one at start, then one after each request it handled), gradients it took
// (a gradient receive posted after a push's header), replies it sent. Each gradient is
// logged with the gradient counts before it, each reply with the counts and the header
// it carried. `idle`: the counts when the server last called wait_any for its next
// request, i.e. after it had answered every pull that its mode allowed.
struct server_log {
  struct counts {
    std::vector<std::uint64_t> requests, gradients, replies;  // [worker]
  };
  struct gradient_event {
    int worker;
    std::vector<std::uint64_t> before;  // gradients taken from each worker before this one
  };
  struct reply_event {
    int worker;
    std::vector<std::uint64_t> gradients;  // gradients taken from each worker when it was sent
    gw::ps::detail::reply_header header;
  };

  explicit server_log(int workers) : now{std::vector<std::uint64_t>(std::size_t(workers), 0),
                                         std::vector<std::uint64_t>(std::size_t(workers), 0),
                                         std::vector<std::uint64_t>(std::size_t(workers), 0)}, idle(now) {}

  void request_posted(int w) {
    std::lock_guard lock(m);
    ++now.requests[std::size_t(w)];
  }
  void gradient_posted(int w) {
    std::lock_guard lock(m);
    gradients.push_back({w, now.gradients});
    ++now.gradients[std::size_t(w)];
  }
  void reply_sent(int w, std::span<const std::byte> bytes) {
    reply_event e{w, {}, {}};
    if (bytes.size() < sizeof e.header) throw std::runtime_error("test: a reply shorter than its header");
    std::memcpy(&e.header, bytes.data(), sizeof e.header);
    std::lock_guard lock(m);
    e.gradients = now.gradients;
    replies.push_back(std::move(e));
    ++now.replies[std::size_t(w)];
  }
  void waiting() {
    {
      std::lock_guard lock(m);
      idle = now;
    }
    cv.notify_all();
  }
  // Waits until the server has gone idle in a state that satisfies pred(counts).
  template <class Pred>
  counts wait_idle(Pred pred, const std::string& what) {
    std::unique_lock lock(m);
    if (!cv.wait_for(lock, hold_limit, [&] { return pred(idle); }))
      throw std::runtime_error("test schedule: waited " + std::to_string(hold_limit.count()) + " s for " + what);
    return idle;
  }

  std::mutex m;
  std::condition_variable cv;
  counts now, idle;
  std::vector<gradient_event> gradients;
  std::vector<reply_event> replies;
};

// inproc that tells a server_log what a server rank sends and receives (null on workers).
class watched_inproc {
 public:
  using request = gw::transport::inproc::request;
  watched_inproc(gw::transport::inproc t, server_log* log) : t_(std::move(t)), log_(log) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    if (log_ && tag == gw::ps::detail::reply_tag) log_->reply_sent(peer, bytes);
    return t_.async_send(peer, tag, bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    if (log_ && tag == gw::ps::detail::request_tag) log_->request_posted(peer);
    if (log_ && tag == gw::ps::detail::gradient_tag) log_->gradient_posted(peer);
    return t_.async_recv(peer, tag, bytes);
  }
  void wait(request& r, gw::deadline until) { t_.wait(r, until); }
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until) {
    if (log_) log_->waiting();
    return t_.wait_any(requests, until);
  }

 private:
  gw::transport::inproc t_;
  server_log* log_;
};
static_assert(gw::concepts::multiplexing_transport<watched_inproc>);

// Histogram of values, as ps::server_stats keeps them (counts[k] = how many were k).
inline void count_into(std::vector<std::uint64_t>& histogram, std::uint64_t value) {
  if (histogram.size() <= value) histogram.resize(value + 1, 0);
  ++histogram[value];
}


// --- the async modes with one worker held by the test ------------------------------

// What run_with_held_worker() saw.
struct held_run {
  struct step_end {  // a worker's step `step` (from 1) had returned, and then ...
    std::uint64_t step;
    std::uint64_t others_started;  // ... the fewest steps any other worker had started
  };
  struct hold {  // the held worker, before its step done + 1
    std::uint64_t done, target;                // its steps done; the fast workers' steps it waited for
    std::vector<std::uint64_t> fast_finished;  // the fast workers' finished steps when it went on
    std::vector<server_log::counts> idle;      // bounded: each server, idle with the fast pulls in hand
  };
  std::vector<std::vector<step_end>> ends;        // [worker]
  std::vector<hold> holds;                        // [held worker's step]
  std::vector<gw::ps::server_stats> stats;        // [server index]
  std::vector<std::unique_ptr<server_log>> logs;  // [server index]
  double loss_before = 0, loss_after = 0;         // of the held worker's first and last parameters
};

// Once every worker is set up, workers 0 .. W-2 step freely; the last worker (held) is
// held by the test before each of its steps. Async: until the fast workers have finished
// every step. Bounded<s>: until they have finished `done + s` steps (as far as the bound
// lets them go), and then until every server has gone idle with each fast worker's next
// pull in hand: a server that answers such a pull answers it before it goes idle, so it is
// in the record whatever the threads' timing. No sleeps: every wait is on a condition the
// test owns.
template <class Mode>
held_run run_with_held_worker(int workers, int servers, int steps, std::uint64_t seed) {
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, Mode, watched_inproc>;
  constexpr bool bounded = Mode::max_lead >= 0;
  const int held = workers - 1;
  const auto data = make_teacher_batches(steps, workers, seed);
  const auto eval = make_teacher_batches(1, 16, seed)[0];
  held_run run;
  run.ends.resize(std::size_t(workers));
  run.stats.resize(std::size_t(servers));
  for (int s = 0; s < servers; ++s) run.logs.push_back(std::make_unique<server_log>(workers));
  step_counts counts(workers);
  std::vector<float> first, last;
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    server_log* log = me >= workers ? run.logs[std::size_t(me - workers)].get() : nullptr;
    S s(watched_inproc(std::move(t), log), start_params<float>(me), gw::optim::sgd({.lr = 0.05}),
        typename S::aggregation_type(small_shards(servers)));
    if (s.is_server()) {
      run.stats[std::size_t(me - workers)] = s.serve();
      return;
    }
    if (me == held) first = flat<float>(s.parameters());
    counts.set_up();
    for (std::uint64_t k = 1; k <= std::uint64_t(steps); ++k) {
      if (me == held) {
        held_run::hold h{k - 1, 0, {}, {}};
        h.target = bounded ? std::min<std::uint64_t>(h.done + std::uint64_t(Mode::max_lead), steps)
                           : (h.done == 0 ? std::uint64_t(steps) : 0);
        counts.wait(
            [&](const auto&, const auto& finished) {
              return std::all_of(finished.begin(), finished.begin() + held, [&](auto n) { return n >= h.target; });
            },
            "the fast workers to finish " + std::to_string(h.target) + " steps");
        if (bounded && h.target < std::uint64_t(steps))
          for (auto& l : run.logs)  // 2 requests per step (push, pull) after the setup's pull and the first post
            h.idle.push_back(l->wait_idle(
                [&](const server_log::counts& c) {
                  return std::all_of(c.requests.begin(), c.requests.begin() + held,
                                     [&](auto n) { return n >= 2 + 2 * (h.target + 1); });
                },
                "every server to have the fast workers' pulls of step " + std::to_string(h.target + 1)));
        const auto finished = counts.now().finished;
        h.fast_finished.assign(finished.begin(), finished.begin() + held);
        run.holds.push_back(std::move(h));
      }
      counts.start(me);
      const auto p = s.parameters();
      s.step(model.gradients<float>(p[0].data(), p[1].data(), data[k - 1][std::size_t(me)]));
      const auto started = counts.now().started;
      counts.finish(me);
      std::uint64_t others = ~std::uint64_t{0};
      for (int v = 0; v < workers; ++v)
        if (v != me) others = std::min(others, started[std::size_t(v)]);
      run.ends[std::size_t(me)].push_back({k, others});
    }
    if (me == held) last = flat<float>(s.parameters());
  });
  run.loss_before = loss(first, eval);
  run.loss_after = loss(last, eval);
  return run;
}

// The largest lead a worker's step returned with, by the workers' records: its step
// number minus the fewest steps another worker had started by then.
inline std::uint64_t largest_lead(const held_run& run) {
  std::uint64_t lead = 0;
  for (const auto& ends : run.ends)
    for (const auto& e : ends) lead = std::max(lead, e.step - std::min(e.step, e.others_started));
  return lead;
}

// A server's traffic, read back (async modes; every worker takes `steps` steps). A reply's
// version should be the slowest worker's clock: the fewest gradients the server had taken
// from any worker (finished workers took every step, so they are never the fewest while
// another is live). A gradient was computed on the parameters of its worker's previous
// reply; its staleness is the version when it was taken minus that reply's version, its
// update lag the gradients applied in between.
struct traffic {
  std::uint64_t max_lead = 0;                   // over replies: the worker's gradients minus the fewest
  std::vector<std::uint64_t> staleness, lag;    // histograms over gradients
};
inline traffic read_traffic(const server_log& log, int workers, int steps) {
  std::vector<std::vector<const server_log::reply_event*>> replies(static_cast<std::size_t>(workers));
  std::vector<std::vector<const server_log::gradient_event*>> gradients(static_cast<std::size_t>(workers));
  for (const auto& r : log.replies) replies[std::size_t(r.worker)].push_back(&r);
  for (const auto& g : log.gradients) gradients[std::size_t(g.worker)].push_back(&g);
  traffic out;
  for (int w = 0; w < workers; ++w) {
    CAPTURE(w);
    const auto& mine = replies[std::size_t(w)];
    REQUIRE(mine.size() == std::size_t(steps) + 1);  // setup's pull, then one per step
    REQUIRE(gradients[std::size_t(w)].size() == std::size_t(steps));
    for (const auto* r : mine) {
      CAPTURE(r->gradients);
      out.max_lead = std::max(out.max_lead, r->gradients[std::size_t(w)] - min_of(r->gradients));
      REQUIRE(r->header.version == min_of(r->gradients));  // the slowest worker's clock
      REQUIRE(r->header.updates == sum_of(r->gradients));  // each gradient applied on arrival
    }
    for (std::size_t k = 0; k < std::size_t(steps); ++k) {
      const auto& g = *gradients[std::size_t(w)][k];
      count_into(out.staleness, min_of(g.before) - min_of(mine[k]->gradients));
      count_into(out.lag, sum_of(g.before) - sum_of(mine[k]->gradients));
    }
  }
  return out;
}

// optim::sgd without set_lr(double): an optimizer whose lr the servers cannot schedule.
class fixed_lr_sgd {
 public:
  static constexpr const char* name = "fixed_lr_sgd";
  template <class T>
  using state = gw::optim::sgd::state<T>;
  explicit fixed_lr_sgd(double lr) : sgd_({.lr = lr}) {}
  template <class T>
  state<T> init(std::size_t n) const {
    return sgd_.init<T>(n);
  }
  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale = T(1)) const {
    sgd_.step(s, params, grads, grad_scale);
  }

 private:
  gw::optim::sgd sgd_;
};
static_assert(gw::concepts::optimizer<fixed_lr_sgd, double>);
static_assert(!gw::concepts::schedulable_optimizer<fixed_lr_sgd> && gw::concepts::schedulable_optimizer<gw::optim::sgd>);

// Async parameter server over Transport (built from an inproc endpoint) whose workers
// step one at a time in a fixed order (0, 1, ..., W-1, then 0 again), each waiting for
// its turn on the test's counts: [worker][step] its parameters after the step.
template <class Transport>
std::vector<std::vector<std::vector<double>>> async_in_turns(int workers, int servers,
                                                             const gw::optim::momentum& opt,
                                                             const std::vector<std::vector<batch_data>>& data) {
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::momentum, gw::ps::async, Transport>;
  step_counts counts(workers);
  std::vector<std::vector<std::vector<double>>> after(static_cast<std::size_t>(workers));
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(Transport(std::move(t)), start_params<double>(me), opt, typename S::aggregation_type(small_shards(servers)));
    if (s.is_server()) {
      s.serve();
      return;
    }
    counts.set_up();
    for (std::size_t k = 0; k < data.size(); ++k) {
      const std::uint64_t turn = k * std::size_t(workers) + std::size_t(me);
      counts.wait([&](const auto&, const auto& finished) { return sum_of(finished) == turn; },
                  "turn " + std::to_string(turn));
      counts.start(me);
      const auto p = s.parameters();
      s.step(model.gradients<double>(p[0].data(), p[1].data(), data[k][std::size_t(me)]));
      after[std::size_t(me)].push_back(flat<double>(s.parameters()));
      counts.finish(me);
    }
  });
  return after;
}

}  // namespace gradwire::test::parameter_server_support
