// Parameter servers on threads (inproc): sharding, sync == all-reduce, async convergence, the
// staleness bound, backup workers' drop accounting, checkpoint resume, and role errors.
// The consistency modes are checked from the test's own records (steps each worker started
// and finished, and a transport wrapper's log of each server's traffic), not from the
// servers' counters; slow workers are held on conditions the test owns, never by sleeping.
// The agent's push order and the async mode over any_transport are in
// test_parameter_server_agent.cpp (a second TU: one took 117 s to compile).
// The same behaviours across processes, including a killed worker, are in tests/multiprocess.
// Servers with standbys run on the simulated transport (a lost rank is a lost peer, and
// virtual time makes the order of events the model's, not the threads'), at the end.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/simulated.hpp>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parameter_server_support.hpp"
#include "standby_support.hpp"

using gradwire::test::is_error;
using namespace gradwire::test::parameter_server_support;

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
      require_close_to_largest(r.before, w);
      require_close_to_largest(r.after, next);  // the late worker's gradient changed nothing, for anyone
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

// --- servers with standbys (ps::options::standby), on the simulated transport -------------

namespace {

// The float64 serial reference of synchronous SGD: each step, every worker's gradient at
// the same parameters, their mean, one step. [step]: the parameters after it.
std::vector<std::vector<double>> serial_sync_sgd(int workers, double lr, const std::vector<std::vector<batch_data>>& data) {
  auto p = flat<double>(start_params<double>(0));
  const std::size_t weights = model.outputs * model.inputs;
  std::vector<std::vector<double>> history;
  for (const auto& batches : data) {
    std::vector<double> sum(p.size(), 0.0);
    for (int w = 0; w < workers; ++w) {
      const auto g = model.gradients<double>(p.data(), p.data() + weights, batches[std::size_t(w)]);
      for (std::size_t i = 0; i < weights; ++i) sum[i] += g[0][i];
      for (std::size_t i = 0; i < model.outputs; ++i) sum[weights + i] += g[1][i];
    }
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * sum[i] / double(workers);
    history.push_back(p);
  }
  return history;
}

}  // namespace

TEST_CASE("parameter_server<sync> with standbys answers no pull of a step before the standby has acknowledged its update, and trains as the float64 serial reference") {
  constexpr int workers = 2, servers = 2, steps = 4;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  replication_record record(servers);
  // Each standby acknowledges an update 1 s (virtual) after it applied it: a server that
  // answered the step's pulls without waiting would answer them a second before.
  const auto run = run_with_standbys(lr, data, record, {.ack_delay = std::chrono::seconds(1)});
  for (const auto& outcome : run.outcomes)
    if (outcome) std::rethrow_exception(outcome);
  std::size_t checked = 0, last_step = 0;
  for (const auto& r : record.replies) {
    CAPTURE(r.rank, r.worker, r.version, r.acked);
    REQUIRE(r.rank < workers + servers);  // no failover: the standbys answered nothing
    REQUIRE(r.version <= r.acked);
    ++checked;
    last_step += r.version == steps ? 1 : 0;
  }
  // Every pull was answered (the setup's, then one per step), the last step's included.
  REQUIRE(checked == std::size_t(servers * workers * (steps + 1)));
  REQUIRE(last_step == std::size_t(servers * workers));
  REQUIRE(record.acked == std::vector<std::uint64_t>(servers, steps));
  for (int k = 0; k < servers; ++k) {
    CAPTURE(k);
    CHECK_FALSE(run.stats[std::size_t(servers + k)].promoted);
    CHECK(run.stats[std::size_t(servers + k)].replicated == std::uint64_t(workers * steps));
  }
  require_serial_trajectories(run, serial_sync_sgd(workers, lr, data));
}

TEST_CASE("parameter_server<sync> with standbys: a server killed right after it answers a step's pull fails over to its standby, and every worker ends with the float64 serial reference (nothing lost, nothing applied twice)") {
  constexpr int workers = 2, servers = 2, steps = 5;
  constexpr std::uint64_t killed_at = 2;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  replication_record record(servers);
  // Server rank 2 dies 20 us after its first reply of version 2, which has reached its
  // worker (2 us away): one worker holds version 2 from the server, the other none. Each
  // standby acknowledges 1 ms after it applied an update.
  const auto run = run_with_standbys(lr, data, record,
                                     {.ack_delay = std::chrono::milliseconds(1),
                                      .kill_rank = workers,
                                      .kill_at = killed_at,
                                      .kill_after = std::chrono::microseconds(20)});
  REQUIRE(run.outcomes[workers]);
  REQUIRE_THROWS_AS(std::rethrow_exception(run.outcomes[workers]), killed_by_test);
  for (std::size_t r = 0; r < run.outcomes.size(); ++r)
    if (r != std::size_t(workers) && run.outcomes[r]) std::rethrow_exception(run.outcomes[r]);
  // The server had answered version 2 to a worker before it died; its standby took over
  // from there, and ended with every worker's every gradient applied once.
  REQUIRE(std::any_of(record.replies.begin(), record.replies.end(),
                      [&](const auto& r) { return r.rank == workers && r.version == killed_at; }));
  const auto& standby = run.stats[std::size_t(servers)];
  CHECK(standby.promoted);
  CHECK(standby.promoted_at == killed_at);
  CHECK(standby.version == std::uint64_t(steps));
  CHECK(standby.applied == std::uint64_t(workers * steps));
  CHECK(standby.dropped == 0);
  const auto& other = run.stats[1];  // server rank 3 served to the end, replicated
  CHECK_FALSE(other.promoted);
  CHECK(other.version == std::uint64_t(steps));
  require_serial_trajectories(run, serial_sync_sgd(workers, lr, data));
}
