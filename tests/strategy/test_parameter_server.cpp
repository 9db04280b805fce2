// Parameter servers on threads (inproc): sharding, sync == all-reduce, async convergence, the
// staleness bound, backup workers' drop accounting, checkpoint resume, and role errors.
// The consistency modes are checked from the test's own records (steps each worker started
// and finished, and a transport wrapper's log of each server's traffic), not from the
// servers' counters; slow workers are held on conditions the test owns, never by sleeping.
// The same behaviours across processes, including a killed worker, are in tests/multiprocess.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/any.hpp>
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

#include "../support/least_squares.hpp"
#include "../support/reference.hpp"

using gradwire::test::is_error;
using gradwire::test::require_trajectories_close;

namespace gw = gradwire;
using gw::testing::batch_data;
using gw::testing::least_squares;

namespace {

const least_squares model{7, 3, 4};

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
std::vector<std::vector<batch_data>> make_batches(int steps, int workers, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<batch_data>> d(steps);
  for (auto& s : d)
    for (int w = 0; w < workers; ++w) s.push_back(model.random_batch(gen));
  return d;
}

// Batches whose targets a linear model can fit: y = A x + c + small noise, so the loss
// of converged training is far below the starting loss.
std::vector<std::vector<batch_data>> make_teacher_batches(int steps, int workers, std::uint64_t seed) {
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

gw::ps::options small_shards(int servers) {
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

double loss(std::span<const float> p, const std::vector<batch_data>& eval) {
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

std::uint64_t min_of(const std::vector<std::uint64_t>& v) { return *std::min_element(v.begin(), v.end()); }
std::uint64_t sum_of(const std::vector<std::uint64_t>& v) { return std::accumulate(v.begin(), v.end(), std::uint64_t{0}); }

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
void count_into(std::vector<std::uint64_t>& histogram, std::uint64_t value) {
  if (histogram.size() <= value) histogram.resize(value + 1, 0);
  ++histogram[value];
}

// got == want up to float64 rounding (1e-12 of the largest magnitude), element by element.
void require_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 1;
  for (double v : want) scale = std::max(scale, std::abs(v));
  std::size_t worst = 0;
  double diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::isnan(got[i] - want[i]) ? std::numeric_limits<double>::infinity() : std::abs(got[i] - want[i]);
    if (d > diff) diff = d, worst = i;
  }
  CAPTURE(worst, got[worst], want[worst], scale);
  REQUIRE(diff <= 1e-12 * scale);
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
std::uint64_t largest_lead(const held_run& run) {
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
traffic read_traffic(const server_log& log, int workers, int steps) {
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
template <class O>
concept schedulable = requires(O& o) { o.set_lr(1.0); };
static_assert(!schedulable<fixed_lr_sgd> && schedulable<gw::optim::sgd>);

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

}  // namespace

TEST_CASE("ps::partition covers every element once and balances the servers") {
  const std::vector<std::size_t> sizes{1000, 10, 0, 4000, 3, 700};
  for (int servers : {1, 2, 3, 5}) {
    CAPTURE(servers);
    const auto pieces = gw::ps::partition(sizes, servers, 512);
    std::vector<std::vector<int>> owner(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) owner[t].assign(sizes[t], 0);
    std::vector<std::size_t> load(servers, 0);
    for (const auto& p : pieces) {
      REQUIRE(p.server >= 0);
      REQUIRE(p.server < servers);
      REQUIRE(p.end <= sizes[p.tensor]);
      for (std::size_t i = p.begin; i < p.end; ++i) ++owner[p.tensor][i];
      load[p.server] += p.size();
      if (sizes[p.tensor] <= 512) REQUIRE(p.size() == sizes[p.tensor]);  // small tensors stay whole
    }
    for (const auto& o : owner)
      for (int c : o) REQUIRE(c == 1);
    const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    // Largest-first greedy: no server holds more than the fair share plus the largest piece.
    std::size_t largest = 0;
    for (const auto& p : pieces) largest = std::max(largest, p.size());
    REQUIRE(*hi <= total / servers + largest);
    if (servers > 1) REQUIRE(*hi - *lo <= largest);
  }
  // The 4000-element tensor is split over every server when each would get more than 512.
  const auto pieces = gw::ps::partition(sizes, 3, 512);
  REQUIRE(std::count_if(pieces.begin(), pieces.end(), [](const auto& p) { return p.tensor == 3; }) == 3);
}

TEST_CASE("parameter_server<sync> trains like all-reduce (SGD and momentum in float, Adam in double)") {
  const int workers = GENERATE(1, 3);
  const int servers = GENERATE(1, 2);
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(workers, servers, seed);
  const auto data = make_batches(5, workers, seed);
  require_trajectories_close(train_ps<float, gw::ps::sync>(workers, servers, gw::optim::sgd({.lr = 0.1}), data, small_shards(servers)),
                train_mirrored<float>(workers, gw::optim::sgd({.lr = 0.1}), data));
  require_trajectories_close(train_ps<float, gw::ps::sync>(workers, servers, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), data,
                                              small_shards(servers)),
                train_mirrored<float>(workers, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), data));
  require_trajectories_close(train_ps<double, gw::ps::sync>(workers, servers, gw::optim::adam({.lr = 0.01}), data, small_shards(servers)),
                train_mirrored<double>(workers, gw::optim::adam({.lr = 0.01}), data));
}

TEST_CASE("parameter_server<bounded_staleness<2>>: no step returns more than s steps ahead of the slowest worker, by the workers' and the wire's records") {
  // A held worker lets the fast ones run ahead exactly as far as the mode allows: they
  // must get s steps ahead of it (no further), their next pulls must wait at every server
  // until it pushes, and no worker's step may ever return more than s ahead of the
  // slowest; all checked from what the test recorded, not from the servers' counters.
  constexpr int s = 2;
  const int workers = 3, servers = 2, steps = 40;
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto run = run_with_held_worker<gw::ps::bounded_staleness<s>>(workers, servers, steps, seed);
  REQUIRE(run.holds.size() == std::size_t(steps));
  for (const auto& h : run.holds) {
    CAPTURE(h.done, h.target, h.fast_finished);
    for (auto finished : h.fast_finished) REQUIRE(finished == h.target);  // s ahead of the held worker, and no further
    if (h.target == std::uint64_t(steps)) continue;
    REQUIRE(h.target == h.done + s);
    REQUIRE(h.idle.size() == std::size_t(servers));
    for (const auto& c : h.idle) {
      CAPTURE(c.requests, c.gradients, c.replies);
      for (int f = 0; f < workers - 1; ++f) {
        REQUIRE(c.gradients[std::size_t(f)] == h.target + 1);  // the fast worker's next gradient is in ...
        REQUIRE(c.replies[std::size_t(f)] == h.target + 1);    // ... but its pull unanswered (setup + target replies)
      }
      REQUIRE(c.gradients[std::size_t(workers - 1)] == h.done);
    }
  }
  // The workers' records: every step returned at most s ahead of every other worker's
  // steps started, and the fast ones reached exactly s.
  REQUIRE(largest_lead(run) == std::uint64_t(s));
  for (int i = 0; i < servers; ++i) {
    CAPTURE(i);
    const auto& st = run.stats[std::size_t(i)];
    const auto seen = read_traffic(*run.logs[std::size_t(i)], workers, steps);
    REQUIRE(seen.max_lead == std::uint64_t(s));  // no pull answered more than s ahead of the slowest
    REQUIRE(seen.staleness.size() <= std::size_t(s) + 1);  // no gradient staler than s
    REQUIRE(st.staleness == seen.staleness);  // the server's histograms agree with its traffic
    REQUIRE(st.update_lag == seen.lag);
    REQUIRE(st.max_lead == seen.max_lead);
    REQUIRE(st.applied == std::uint64_t(workers * steps));
    REQUIRE(st.dropped == 0);
    REQUIRE(st.pushes == std::vector<std::uint64_t>(std::size_t(workers), std::uint64_t(steps)));
    REQUIRE(st.version == std::uint64_t(steps));
  }
  CAPTURE(run.loss_before, run.loss_after);
  REQUIRE(run.loss_after < 0.1 * run.loss_before);
}

TEST_CASE("parameter_server<async>: fast workers finish every step while another is held, and training converges") {
  // The same schedule as the bounded test without a bound: the fast workers run all their
  // steps before the held worker takes its first, so the bound above is the gate's doing.
  const int workers = 3, servers = 2, steps = 40;
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto run = run_with_held_worker<gw::ps::async>(workers, servers, steps, seed);
  REQUIRE(run.holds.size() == std::size_t(steps));
  REQUIRE(run.holds[0].fast_finished == std::vector<std::uint64_t>(std::size_t(workers - 1), std::uint64_t(steps)));
  REQUIRE(largest_lead(run) == std::uint64_t(steps));  // a fast worker's last step returned before the held one started
  for (int i = 0; i < servers; ++i) {
    CAPTURE(i);
    const auto& st = run.stats[std::size_t(i)];
    const auto seen = read_traffic(*run.logs[std::size_t(i)], workers, steps);
    REQUIRE(seen.max_lead == std::uint64_t(steps));
    // The held worker's first gradient was computed before any other was applied ...
    REQUIRE(seen.lag.size() == std::size_t((workers - 1) * steps) + 1);
    // ... yet no gradient is stale: the held worker's clock holds the version back (the
    // slowest live worker's), so it is the update lag that grows, not the staleness.
    REQUIRE(seen.staleness == std::vector<std::uint64_t>{std::uint64_t(workers * steps)});
    REQUIRE(st.staleness == seen.staleness);
    REQUIRE(st.update_lag == seen.lag);
    REQUIRE(st.max_lead == seen.max_lead);
    REQUIRE(st.applied == std::uint64_t(workers * steps));  // every gradient applied, none dropped
    REQUIRE(st.dropped == 0);
    REQUIRE(st.updates == st.applied);
    REQUIRE(st.version == std::uint64_t(steps));
  }
  CAPTURE(run.loss_before, run.loss_after);
  REQUIRE(run.loss_after < 0.1 * run.loss_before);
}

TEST_CASE("parameter_server<backup_workers<1>> closes each step with the first workers - 1 gradients and drops the late one, by the workers' records") {
  // Each step one worker (in turn) is held by the test until the other two have finished
  // the step: their two gradients must close it (the servers answer their pulls), and the
  // held one's must be dropped. Every worker records the parameters it read and got back,
  // which must follow a float64 reference that averages the two on-time gradients only.
  const int workers = 3, servers = 2, steps = 12;
  const double lr = 0.1;
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::backup_workers<1>>;
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  auto late_at = [&](int k) { return k % workers; };
  struct step_record {
    std::vector<double> before, after;
    std::vector<std::uint64_t> started;  // every worker's steps started when this step returned
  };
  std::vector<std::vector<step_record>> records(static_cast<std::size_t>(workers));
  std::vector<gw::ps::server_stats> stats(static_cast<std::size_t>(servers));
  step_counts counts(workers);
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<double>(me), gw::optim::sgd({.lr = lr}), S::aggregation_type(small_shards(servers)));
    if (s.is_server()) {
      stats[std::size_t(me - workers)] = s.serve();
      return;
    }
    counts.set_up();
    for (int k = 0; k < steps; ++k) {
      const auto step = std::uint64_t(k);
      if (me == late_at(k))  // until the step has closed without it
        counts.wait(
            [&](const auto&, const auto& finished) {
              for (int v = 0; v < workers; ++v)
                if (v != me && finished[std::size_t(v)] < step + 1) return false;
              return true;
            },
            "the on-time workers to finish step " + std::to_string(k));
      else  // until everyone has finished the step before
        counts.wait([&](const auto&, const auto& finished) { return min_of(finished) >= step; },
                    "every worker to finish step " + std::to_string(k - 1));
      step_record r;
      r.before = flat<double>(s.parameters());
      counts.start(me);
      const auto p = s.parameters();
      s.step(model.gradients<double>(p[0].data(), p[1].data(), data[std::size_t(k)][std::size_t(me)]));
      r.started = counts.now().started;  // before finish(me): nobody can start the next step yet
      counts.finish(me);
      r.after = flat<double>(s.parameters());
      records[std::size_t(me)].push_back(std::move(r));
    }
  });
  // Float64 reference: each step moves by lr times the mean of the on-time gradients.
  std::vector<double> w = flat<double>(start_params<double>(0));
  const std::size_t weights = model.outputs * model.inputs;
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    std::vector<double> sum(w.size(), 0.0);
    for (int v = 0; v < workers; ++v) {
      if (v == late_at(k)) continue;
      const auto g = model.gradients<double>(w.data(), w.data() + weights, data[std::size_t(k)][std::size_t(v)]);
      for (std::size_t i = 0; i < weights; ++i) sum[i] += g[0][i];
      for (std::size_t i = 0; i < model.outputs; ++i) sum[weights + i] += g[1][i];
    }
    std::vector<double> next(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) next[i] = w[i] - lr * (sum[i] / double(workers - 1));
    for (int v = 0; v < workers; ++v) {
      CAPTURE(v);
      const auto& r = records[std::size_t(v)][std::size_t(k)];
      require_close(r.before, w);
      require_close(r.after, next);  // the late worker's gradient changed nothing, for anyone
      if (v != late_at(k))  // its pull was answered only once the other on-time gradient was in
        for (int u = 0; u < workers; ++u)
          if (u != v && u != late_at(k)) REQUIRE(r.started[std::size_t(u)] == std::uint64_t(k) + 1);
    }
    w = next;
  }
  for (int i = 0; i < servers; ++i) {
    CAPTURE(i);
    const auto& st = stats[std::size_t(i)];
    REQUIRE(st.pushes == std::vector<std::uint64_t>(std::size_t(workers), std::uint64_t(steps)));
    for (int v = 0; v < workers; ++v) REQUIRE(st.dropped_by[std::size_t(v)] == std::uint64_t(steps / workers));
    REQUIRE(st.dropped == std::uint64_t(steps));
    REQUIRE(st.applied == std::uint64_t(steps * (workers - 1)));
    REQUIRE(st.updates == std::uint64_t(steps));
    REQUIRE(st.version == std::uint64_t(steps));
  }
}

TEST_CASE("parameter_server servers checkpoint their shards and a restarted job resumes from them") {
  const auto dir = std::filesystem::temp_directory_path() / ("gradwire-ps-ckpt-" + std::to_string(std::random_device{}()));
  const auto data = make_batches(8, 2, 11);
  auto options = small_shards(2);
  options.checkpoint_dir = dir;
  options.checkpoint_every = 3;
  const auto first = std::vector<std::vector<batch_data>>(data.begin(), data.begin() + 4);
  const auto second = std::vector<std::vector<batch_data>>(data.begin() + 4, data.end());
  std::vector<gw::ps::server_stats> stats;
  const auto a = train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), first, options, &stats);
  REQUIRE(std::filesystem::exists(dir / "ps-shard-0-of-2.ckpt"));
  REQUIRE(std::filesystem::exists(dir / "ps-shard-1-of-2.ckpt"));
  stats.clear();
  const auto b = train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), second, options, &stats);
  for (const auto& st : stats) REQUIRE(st.version == 8);  // resumed at 4, then 4 more steps
  // Resumed (parameters and Adam state) == trained straight through.
  const auto straight = train_mirrored<double>(2, gw::optim::adam({.lr = 0.01}), data);
  require_trajectories_close(a, std::vector<std::vector<double>>(straight.begin(), straight.begin() + 4));
  require_trajectories_close(b, std::vector<std::vector<double>>(straight.begin() + 4, straight.end()));
  // A shard file saved for other tensor sizes is refused with the file named.
  std::filesystem::resize_file(dir / "ps-shard-1-of-2.ckpt", 40);
  auto resume_again = [&] { train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), second, options); };
  REQUIRE_THROWS_MATCHES(resume_again(), gw::error, is_error(gw::errc::config, {"ps-shard-1-of-2.ckpt"}));
  std::filesystem::remove_all(dir);
}

TEST_CASE("parameter_server refuses a job without a worker or server, and step() on a server") {
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  REQUIRE_THROWS_MATCHES(gw::transport::run_inproc(2,
                                                [](gw::transport::inproc t) {
                                                  S s(t, start_params<float>(t.rank()), gw::optim::sgd(), S::aggregation_type(small_shards(2)));
                                                }), gw::error,
                      is_error(gw::errc::config, {"parameter_server: 2 server(s) in a job of 2 ranks: a job needs at "
                                                  "least one server and one worker"}));
  REQUIRE_THROWS_MATCHES(gw::transport::run_inproc(2,
                                                [](gw::transport::inproc t) {
                                                  S s(t, start_params<float>(t.rank()), gw::optim::sgd(), S::aggregation_type(small_shards(1)));
                                                  if (s.is_server())
                                                    s.step(std::vector<std::vector<float>>{
                                                        std::vector<float>(model.outputs * model.inputs),
                                                        std::vector<float>(model.outputs)});
                                                }), gw::error,
                      is_error(gw::errc::invalid_argument, {"rank 1 is a server: call serve() on it instead of stepping"}));
}

TEST_CASE("parameter_server skips a server that holds none of the model, and a moved strategy finishes once") {
  // Two small tensors on three servers: one server holds nothing, and workers never wait for it.
  const auto data = make_batches(4, 2, 5);
  gw::ps::options o;
  o.timeout = std::chrono::seconds(60);
  std::vector<gw::ps::server_stats> stats;
  require_trajectories_close(train_ps<float, gw::ps::sync>(2, 3, gw::optim::sgd({.lr = 0.1}), data, o, &stats),
                train_mirrored<float>(2, gw::optim::sgd({.lr = 0.1}), data));
  REQUIRE(stats.size() == 3);
  REQUIRE(std::count_if(stats.begin(), stats.end(), [](const auto& s) { return s.applied == 0; }) == 1);

  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    S s(t, start_params<float>(t.rank()), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(small_shards(1)));
    S moved = std::move(s);  // the moved-from strategy must not tell the server anything
    if (moved.is_server()) {
      REQUIRE(moved.serve().pushes == std::vector<std::uint64_t>{1});
      return;
    }
    const auto p = moved.parameters();
    moved.step(model.gradients<float>(p[0].data(), p[1].data(), data[0][0]));
  });
}

TEST_CASE("parameter_server staleness_aware_lr divides each async step by the gradient's update lag") {
  // Every gradient is all ones, so each parameter moves by -lr * (sum over gradients of
  // 1 / max(1, update lag)), which the server's update-lag histogram determines exactly.
  const int workers = 3, steps = 20;
  const double lr = 0.01;
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::async>;
  auto options = small_shards(1);
  options.staleness_aware_lr = true;
  gw::ps::server_stats stats;
  std::vector<double> served;  // the server's parameters when it stops: the final model
  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
    S s(t, start_params<double>(t.rank()), gw::optim::sgd({.lr = lr}), S::aggregation_type(options));
    if (s.is_server()) {
      stats = s.serve();
      served = flat<double>(s.parameters());
      return;
    }
    const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                                std::vector<double>(model.outputs, 1.0)};
    for (int k = 0; k < steps; ++k) s.step(ones);
  });
  double factor = 0;
  for (std::size_t lag = 0; lag < stats.update_lag.size(); ++lag)
    factor += double(stats.update_lag[lag]) / double(std::max<std::size_t>(1, lag));
  CAPTURE(factor, stats.update_lag);
  REQUIRE(stats.applied == std::uint64_t(workers * steps));
  const auto start = flat<double>(start_params<double>(0));
  REQUIRE(served.size() == start.size());
  for (std::size_t i = 0; i < start.size(); ++i) REQUIRE(served[i] == Approx(start[i] - lr * factor).epsilon(1e-12));
  // Without the option every gradient takes a full step.
  options.staleness_aware_lr = false;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    S s(t, start_params<double>(t.rank()), gw::optim::sgd({.lr = lr}), S::aggregation_type(options));
    if (s.is_server()) {
      s.serve();
      served = flat<double>(s.parameters());
      return;
    }
    const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                                std::vector<double>(model.outputs, 1.0)};
    for (int k = 0; k < steps; ++k) s.step(ones);
  });
  for (std::size_t i = 0; i < start.size(); ++i) REQUIRE(served[i] == Approx(start[i] - lr * steps).epsilon(1e-12));
}

namespace {
// inproc that counts, per rank, the gradient receives it posted: a server posts one once
// a worker's push header has arrived, so the count says which servers a push reached.
class counting_inproc {
 public:
  using request = gw::transport::inproc::request;
  counting_inproc(gw::transport::inproc t, std::vector<std::atomic<int>>* gradient_receives)
      : t_(std::move(t)), receives_(gradient_receives) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    return t_.async_send(peer, tag, bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    if (tag == gw::ps::detail::gradient_tag) ++(*receives_)[static_cast<std::size_t>(rank())];
    return t_.async_recv(peer, tag, bytes);
  }
  void wait(request& r, gw::deadline until) { t_.wait(r, until); }
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until) { return t_.wait_any(requests, until); }

 private:
  gw::transport::inproc t_;
  std::vector<std::atomic<int>>* receives_;
};
static_assert(gw::concepts::multiplexing_transport<counting_inproc>);
}  // namespace

TEST_CASE("parameter_server agent pushes a server's shard as soon as that shard's tensors are ready") {
  // One worker, two servers, two tensors that stay whole: each server holds one of them.
  using policy = gw::aggregation::parameter_server<gw::ps::sync>;
  using agent = policy::agent<double, counting_inproc>;
  const std::vector<std::size_t> sizes{48, 40};
  gw::ps::options o;
  o.servers = 2;
  o.timeout = std::chrono::seconds(60);
  const gw::ps::sharding shards(sizes, o.servers, o.split_bytes / sizeof(double));
  REQUIRE(shards.servers_of(0).size() == 1);
  REQUIRE(shards.servers_of(1).size() == 1);
  const int server_of_first = shards.servers_of(0)[0], server_of_second = shards.servers_of(1)[0];
  REQUIRE(server_of_first != server_of_second);
  const int first_rank = 1 + server_of_first, second_rank = 1 + server_of_second;  // rank 0 is the worker

  const double lr = 0.5;
  std::vector<std::atomic<int>> receives(3);
  std::vector<std::vector<double>> final_params;
  std::vector<gw::ps::server_stats> stats(2);
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    gw::collective::communicator<counting_inproc> comm(counting_inproc(std::move(t), &receives));
    std::vector<std::vector<double>> p{std::vector<double>(sizes[0], 1.0), std::vector<double>(sizes[1], 2.0)};
    const std::vector<std::span<double>> params{p[0], p[1]};
    agent a{policy(o)};
    a.setup(comm, params);
    if (a.is_server(comm.rank(), comm.size())) {
      stats[static_cast<std::size_t>(comm.rank() - 1)] = a.serve(comm, params, gw::optim::sgd({.lr = lr}));
      return;
    }
    const std::vector<double> g0(sizes[0], 0.25), g1(sizes[1], -1.0);
    for (int step = 0; step < 2; ++step) {
      a.begin_step(comm);
      a.ready(comm, 0, g0);
      // The first tensor's server has the push (it is receiving the gradient) before the
      // second tensor is ready; the other server has nothing yet. No time limit but the
      // test's: the receive is posted whenever the server's thread gets to it.
      while (receives[static_cast<std::size_t>(first_rank)].load() < step + 1) std::this_thread::yield();
      REQUIRE(receives[static_cast<std::size_t>(second_rank)].load() == step);
      a.ready(comm, 1, g1);
      a.finish_step(comm, params, [](std::size_t, std::span<const double>, double) { FAIL("workers do not apply"); });
      REQUIRE(receives[static_cast<std::size_t>(second_rank)].load() == step + 1);
      REQUIRE(a.version() == std::uint64_t(step + 1));  // sync: the step closed on both servers
      REQUIRE(a.last_staleness() == 0);
    }
    a.finish(comm);
    final_params = p;
  });
  // Two SGD steps on constant gradients, applied by the servers and pulled back.
  for (double v : final_params[0]) REQUIRE(v == Approx(1.0 - 2 * lr * 0.25).epsilon(1e-15));
  for (double v : final_params[1]) REQUIRE(v == Approx(2.0 + 2 * lr * 1.0).epsilon(1e-15));
  for (const auto& st : stats) {
    REQUIRE(st.pushes == std::vector<std::uint64_t>{2});
    REQUIRE(st.version == 2);
    REQUIRE(st.applied == 2);
  }
}

TEST_CASE("parameter_server agent refuses a step out of order and names what is missing") {
  using agent = gw::aggregation::parameter_server<gw::ps::async>::agent<float, gw::transport::inproc>;
  gw::ps::options o;
  o.timeout = std::chrono::seconds(60);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    gw::collective::communicator<gw::transport::inproc> comm(std::move(t));
    std::vector<float> p0(3, 1.0f), p1(2, 1.0f);
    const std::vector<std::span<float>> params{p0, p1};
    agent a(o);
    a.setup(comm, params);
    if (a.is_server(comm.rank(), comm.size())) {
      REQUIRE_THROWS_WITH(a.begin_step(comm), Catch::Contains("is a server: call serve()"));
      a.serve(comm, params, gw::optim::sgd({.lr = 0.1}));
      return;
    }
    const std::vector<float> g0(3, 1.0f), g1(2, 1.0f);
    REQUIRE_THROWS_WITH(a.ready(comm, 0, g0), Catch::Contains("outside a step"));
    a.begin_step(comm);
    a.ready(comm, 1, g1);
    REQUIRE_THROWS_WITH(a.ready(comm, 1, g1), Catch::Contains("gradient 1 was ready twice"));
    REQUIRE_THROWS_WITH(a.finish_step(comm, params, [](std::size_t, std::span<const float>, float) {}),
                        Catch::Contains("before gradient 0 was ready"));
    a.ready(comm, 0, g0);
    a.finish_step(comm, params, [](std::size_t, std::span<const float>, float) {});
    REQUIRE(a.applied() == 1);
    REQUIRE(p0[0] == Approx(0.9f));
    a.finish(comm);  // what strategy<>'s destructor does: the server stops waiting
  });
}

TEST_CASE("parameter_server<async> over transport::any_transport gives inproc's parameters, step by step, on a fixed schedule") {
  // The workers step one at a time in a fixed order, so the servers apply the same
  // gradients in the same order whatever the transport: the erased one must give inproc's
  // parameters bit for bit, and both a float64 reference of the same schedule (each worker's
  // gradient taken at the parameters its previous step pulled; momentum on the servers).
  const int workers = 3, servers = 2, steps = 8;
  const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9});
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const auto direct = async_in_turns<gw::transport::inproc>(workers, servers, opt, data);
  const auto erased = async_in_turns<gw::transport::any_transport>(workers, servers, opt, data);

  const std::size_t weights = model.outputs * model.inputs;
  std::vector<double> w = flat<double>(start_params<double>(0)), velocity(w.size(), 0.0);
  std::vector<std::vector<double>> pulled(static_cast<std::size_t>(workers), w);  // each worker's copy
  for (std::size_t k = 0; k < std::size_t(steps); ++k)
    for (int v = 0; v < workers; ++v) {
      CAPTURE(k, v);
      auto& mine = pulled[std::size_t(v)];
      const auto g = model.gradients<double>(mine.data(), mine.data() + weights, data[k][std::size_t(v)]);
      for (std::size_t i = 0; i < w.size(); ++i) {
        velocity[i] = 0.9 * velocity[i] + (i < weights ? g[0][i] : g[1][i - weights]);
        w[i] -= 0.05 * velocity[i];
      }
      mine = w;
      REQUIRE(direct[std::size_t(v)].size() == std::size_t(steps));
      REQUIRE(erased[std::size_t(v)].size() == std::size_t(steps));
      REQUIRE(erased[std::size_t(v)][k] == direct[std::size_t(v)][k]);  // element by element, exactly
      require_close(direct[std::size_t(v)][k], w);
    }
}

TEST_CASE("parameter_server: a server that hears from no worker for ps::options::timeout fails with timeout, naming its rank, the time and the workers it expects") {
  // The workers are held by the test (they never step) until the server has given up.
  const int workers = 2;
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::async>;
  auto options = small_shards(1);
  options.timeout = std::chrono::milliseconds(500);
  std::mutex m;
  std::condition_variable cv;
  bool server_failed = false;
  std::chrono::steady_clock::duration served_for{};
  auto run = [&] {
    gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
      S s(t, start_params<float>(t.rank()), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(options));
      if (s.is_server()) {
        const auto began = std::chrono::steady_clock::now();
        try {
          s.serve();
        } catch (const gw::error&) {
          served_for = std::chrono::steady_clock::now() - began;
          {
            std::lock_guard lock(m);
            server_failed = true;
          }
          cv.notify_all();
          throw;
        }
        return;  // served without a timeout: the workers' hold below fails the run
      }
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, hold_limit, [&] { return server_failed; }))
        throw std::runtime_error("test: the server did not time out while its workers were held");
    });
  };
  REQUIRE_THROWS_MATCHES(run(), gw::error,
                         is_error(gw::errc::timeout, {"parameter server rank 2: no worker sent anything for 500 ms "
                                                      "(2 still expected); are they stuck, or is the timeout too short?"}));
  REQUIRE(served_for >= options.timeout);
}

TEST_CASE("parameter_server: ps::options::learning_rate with an optimizer without set_lr(double) fails with invalid_argument, and with set_lr it sets the lr of every update") {
  const int steps = 3;
  const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                              std::vector<double>(model.outputs, 1.0)};
  auto schedule = small_shards(1);
  schedule.learning_rate = [](std::uint64_t, std::uint64_t) { return 0.25; };
  // One worker stepping `steps` times with gradients of ones; the server's final parameters.
  auto train = [&]<class Optimizer>(const Optimizer& opt, const gw::ps::options& o) {
    using S = gw::parameter_server<gw::host_tensor<double>, Optimizer, gw::ps::sync>;
    std::vector<double> served;
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      S s(t, start_params<double>(t.rank()), opt, typename S::aggregation_type(o));
      if (s.is_server()) {
        s.serve();
        served = flat<double>(s.parameters());
        return;
      }
      for (int k = 0; k < steps; ++k) s.step(ones);
    });
    return served;
  };
  REQUIRE_THROWS_MATCHES(train(fixed_lr_sgd{0.01}, schedule), gw::error,
                         is_error(gw::errc::invalid_argument,
                                  {"parameter_server: ps::options::learning_rate needs an optimizer with set_lr(double)"}));
  const auto start = flat<double>(start_params<double>(0));
  const auto own_lr = train(fixed_lr_sgd{0.01}, small_shards(1));  // without the schedule it trains at its own lr
  const auto scheduled = train(gw::optim::sgd({.lr = 0.01}), schedule);  // with set_lr, at the schedule's
  REQUIRE(own_lr.size() == start.size());
  REQUIRE(scheduled.size() == start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    CAPTURE(i);
    REQUIRE(own_lr[i] == Approx(start[i] - steps * 0.01).epsilon(1e-12));
    REQUIRE(scheduled[i] == Approx(start[i] - steps * 0.25).epsilon(1e-12));
  }
}

TEST_CASE("parameter_server: serve() on a worker rank fails with invalid_argument naming the rank, and the job goes on") {
  const int workers = 2, steps = 3;
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  std::vector<std::pair<gw::errc, std::string>> refused(static_cast<std::size_t>(workers), {gw::errc{}, "serve() returned"});
  std::vector<std::vector<float>> history(static_cast<std::size_t>(steps));
  gw::ps::server_stats stats;
  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<float>(me), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(small_shards(1)));
    if (s.is_server()) {
      stats = s.serve();
      return;
    }
    try {
      s.serve();
    } catch (const gw::error& e) {
      refused[std::size_t(me)] = {e.kind(), e.what()};
    }
    for (int k = 0; k < steps; ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<float>(p[0].data(), p[1].data(), data[std::size_t(k)][std::size_t(me)]));
      if (me == 0) history[std::size_t(k)] = flat<float>(s.parameters());
    }
  });
  for (int w = 0; w < workers; ++w) {
    CAPTURE(w, refused[std::size_t(w)].second);
    REQUIRE(refused[std::size_t(w)].first == gw::errc::invalid_argument);
    REQUIRE_THAT(refused[std::size_t(w)].second,
                 Catch::Contains("parameter_server: rank " + std::to_string(w) +
                                 " is a worker: serve() is for the server ranks (the last 1)"));
  }
  // The refused call changed nothing: the job trains as all-reduce does.
  REQUIRE(stats.pushes == std::vector<std::uint64_t>(std::size_t(workers), std::uint64_t(steps)));
  require_trajectories_close(history, train_mirrored<float>(workers, gw::optim::sgd({.lr = 0.1}), data));
}
