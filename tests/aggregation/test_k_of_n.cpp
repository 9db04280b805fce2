// K of N for all-reduce (all_reduce_options::backup_workers) through strategy<> on inproc threads: the late ranks'
// gradients are left out, every rank applies the others' mean, and the result equals a float64 reference over
// exactly the recorded sets, bit-identical on every replica.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/simulated.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;
using namespace std::chrono_literals;

namespace {

// Mixed sizes, an empty tensor among them, so that small budgets cut several buckets.
const std::vector<std::size_t> tensor_sizes{5, 300, 0, 64, 1000, 3};

using grads_type = std::vector<std::vector<std::vector<std::vector<double>>>>;  // [step][rank][tensor][element]

grads_type random_gradients(int steps, int ranks, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist;
  grads_type grads(static_cast<std::size_t>(steps));
  for (auto& step : grads) {
    step.resize(static_cast<std::size_t>(ranks));
    for (auto& rank : step)
      for (std::size_t n : tensor_sizes) {
        rank.emplace_back(n);
        for (auto& g : rank.back()) g = dist(gen);
      }
  }
  return grads;
}

std::vector<gw::host_tensor<double>> start_params() {
  std::vector<gw::host_tensor<double>> params;
  for (std::size_t n : tensor_sizes) params.emplace_back(gw::shape{n});
  for (auto& p : params)
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.5 - 0.001 * double(i);
  return params;
}

// A slow rank waits (on a rank thread: a failure reaches the test through run_inproc) until
// `done`, which only the other ranks' progress makes true; past 20 s the test fails with `what`.
template <class Done>
void wait_until(Done done, const std::string& what) {
  const auto give_up = gw::clock::now() + 20s;
  while (!done()) {
    if (gw::clock::now() > give_up) throw std::runtime_error(what);
    std::this_thread::sleep_for(1ms);
  }
}

using strategy_type =
    gw::strategy<gw::host_tensor<double>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::inproc>;

struct run_result {
  std::vector<std::vector<std::vector<int>>> sets;  // [step][rank]: the set the rank saw
  std::vector<std::vector<char>> dropped;           // [step][rank]: its stats said dropped (not vector<bool>: ranks write it at once)
  std::vector<std::vector<gw::host_tensor<double>>> params;  // [rank]
  std::vector<std::uint64_t> dropped_total;                  // [rank]: the cumulative stats
};

// Each rank opens every step (begin_step: its close watch listens from then on), and a
// rank that `slow(step, rank)` says is slow marks its gradients only once `fast` ranks have
// finished that step, which they can only do without it.
template <class Slow>
run_result train(int ranks, int backups, std::size_t bucket_bytes, const grads_type& grads, Slow slow, int fast) {
  const int steps = static_cast<int>(grads.size());
  run_result out;
  out.sets.assign(static_cast<std::size_t>(steps), std::vector<std::vector<int>>(static_cast<std::size_t>(ranks)));
  out.dropped.assign(static_cast<std::size_t>(steps), std::vector<char>(static_cast<std::size_t>(ranks)));
  out.params.resize(static_cast<std::size_t>(ranks));
  out.dropped_total.resize(static_cast<std::size_t>(ranks));
  std::vector<std::atomic<int>> finished(static_cast<std::size_t>(steps));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int r = t.rank();
    strategy_type s(std::move(t), start_params(), gw::optim::sgd({.lr = 0.1}),
                    gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{.bucket_bytes = bucket_bytes,
                                                                                    .backup_workers = backups}));
    for (int k = 0; k < steps; ++k) {
      auto step = s.begin_step();
      if (slow(k, r)) {
        wait_until([&] { return finished[static_cast<std::size_t>(k)].load() >= fast; },
                   "rank " + std::to_string(r) + " step " + std::to_string(k) + ": the fast ranks waited for a slow one");
      }
      const auto& g = grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < g.size(); ++i) step.ready(i, g[i]);
      step.finish();
      if (!slow(k, r)) ++finished[static_cast<std::size_t>(k)];
      out.sets[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] = s.aggregation().last_step_set().in;
      out.dropped[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] = s.last_step_stats().dropped == 1;
    }
    out.dropped_total[static_cast<std::size_t>(r)] = s.cumulative_stats().dropped;
    out.params[static_cast<std::size_t>(r)].assign(s.parameters().begin(), s.parameters().end());
  });
  return out;
}

// The float64 serial reference: SGD on the mean of exactly the recorded set's gradients.
void check_against_reference(const run_result& got, const grads_type& grads, int ranks) {
  auto expected = start_params();
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const auto& set = got.sets[k][0];
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        double sum = 0;
        for (int q : set) sum += grads[k][static_cast<std::size_t>(q)][t][i];
        expected[t][i] -= 0.1 * sum / double(set.size());
      }
  }
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        REQUIRE(got.params[static_cast<std::size_t>(r)][t][i] == Approx(expected[t][i]).epsilon(1e-12).margin(1e-12));
        REQUIRE(got.params[static_cast<std::size_t>(r)][t][i] == got.params[0][t][i]);  // bit-identical replicas
      }
  }
}

}  // namespace

TEST_CASE("K of N: the slow ranks' gradients are left out, and every replica applies the others' mean") {
  const int ranks = GENERATE(2, 3, 4);
  const std::size_t bucket_bytes = GENERATE(as<std::size_t>{}, 64, gw::collective::default_bucket_bytes);
  for (int backups = 1; backups < ranks; ++backups) {
    const std::uint64_t seed = std::random_device{}();
    CAPTURE(ranks, bucket_bytes, backups, seed);
    const int steps = 5, fast = ranks - backups;
    const auto grads = random_gradients(steps, ranks, seed);
    // A different rank is slow each step but the first: the first step ends with a collective
    // of every rank (the buckets adopt rank 0's gradient order), so it waits for all of them once.
    auto slow = [&](int k, int r) { return k > 0 && (r + k) % ranks >= fast; };
    const auto got = train(ranks, backups, bucket_bytes, grads, slow, fast);
    for (int k = 0; k < steps; ++k) {
      // Step 0 has no slow rank: any N - b or more may be first; the others are exactly the fast.
      const auto& seen = got.sets[static_cast<std::size_t>(k)][0];
      std::vector<int> expected;
      for (int r = 0; r < ranks; ++r)
        if (!slow(k, r)) expected.push_back(r);
      CAPTURE(k);
      if (k == 0)
        REQUIRE(static_cast<int>(seen.size()) >= fast);
      else
        REQUIRE(seen == expected);
      for (int r = 0; r < ranks; ++r) {
        CAPTURE(r);
        REQUIRE(got.sets[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] == seen);
        REQUIRE(bool(got.dropped[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)]) ==
                !std::binary_search(seen.begin(), seen.end(), r));
      }
    }
    for (int r = 0; r < ranks; ++r) {
      std::uint64_t times_out = 0;
      for (int k = 0; k < steps; ++k) {
        const auto& seen = got.sets[static_cast<std::size_t>(k)][0];
        times_out += std::binary_search(seen.begin(), seen.end(), r) ? 0 : 1;
      }
      REQUIRE(got.dropped_total[static_cast<std::size_t>(r)] == times_out);
    }
    check_against_reference(got, grads, ranks);
  }
}

TEST_CASE("K of N without a straggler: every step holds at least N - b ranks, the same on all, and the maths holds") {
  const int ranks = GENERATE(3, 4);
  const int backups = 1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, seed);
  const auto grads = random_gradients(8, ranks, seed);
  const auto got = train(ranks, backups, 256, grads, [](int, int) { return false; }, 0);
  for (std::size_t k = 0; k < grads.size(); ++k) {
    CAPTURE(k);
    REQUIRE(static_cast<int>(got.sets[k][0].size()) >= ranks - backups);
    for (int r = 0; r < ranks; ++r) REQUIRE(got.sets[k][static_cast<std::size_t>(r)] == got.sets[k][0]);
  }
  check_against_reference(got, grads, ranks);
}

TEST_CASE("K of N with planned steps: a replica slow through them all is left out of every one, without being waited for, and catches up at each step's rate") {
  // Reference: rank N-1 opens step 0 and marks its gradients only once every other rank has
  // finished every planned step, which they can only do if its communicator thread runs the
  // steps without it. Its one finish then applies them all, and the loop skips ahead.
  const int ranks = GENERATE(2, 3, 4);
  const int steps = 6;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, seed);
  const auto grads = random_gradients(steps, ranks, seed);
  std::vector<std::vector<std::vector<int>>> sets(static_cast<std::size_t>(ranks));  // [rank][finish]
  std::vector<std::vector<std::uint64_t>> advanced(static_cast<std::size_t>(ranks));
  std::vector<std::vector<gw::host_tensor<double>>> params(static_cast<std::size_t>(ranks));
  std::vector<double> after(static_cast<std::size_t>(ranks));
  std::atomic<int> fast_steps_done{0};
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int r = t.rank();
    const bool slow = r == ranks - 1;
    strategy_type s(std::move(t), start_params(), gw::optim::sgd({.lr = 0.1}),
                    gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{
                        .bucket_bytes = 256, .backup_workers = 1, .max_steps_behind = steps}));
    s.schedule_lr([](std::uint64_t step) { return 0.1 / double(1 + step); });
    s.aggregation().plan_steps(steps);
    for (int k = 0; k < steps;) {
      auto step = s.begin_step();
      if (slow) {
        wait_until([&] { return fast_steps_done.load() >= (ranks - 1) * steps; }, "the fast ranks waited for the slow one");
      }
      const auto& g = grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < g.size(); ++i) step.ready(i, g[i]);
      step.finish();
      if (!slow) ++fast_steps_done;
      sets[static_cast<std::size_t>(r)].push_back(s.aggregation().last_step_set().in);
      advanced[static_cast<std::size_t>(r)].push_back(s.aggregation().last_steps_advanced());
      k += static_cast<int>(s.aggregation().last_steps_advanced());
    }
    // The plan is done: the communicator is the caller's again.
    double x = r + 1;
    gw::collective::all_reduce(s.communicator(), std::span<double>(&x, 1));
    after[static_cast<std::size_t>(r)] = x;
    params[static_cast<std::size_t>(r)].assign(s.parameters().begin(), s.parameters().end());
  });
  std::vector<int> fast;
  for (int q = 0; q + 1 < ranks; ++q) fast.push_back(q);
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(after[static_cast<std::size_t>(r)] == double(ranks * (ranks + 1) / 2));
    if (r == ranks - 1) {
      // One finish applies every step (or all but the last, when the others finished before
      // this rank's own share of the last reduction came in: then a second finish takes it).
      const auto& a = advanced[static_cast<std::size_t>(r)];
      REQUIRE(std::accumulate(a.begin(), a.end(), std::uint64_t{0}) == steps);
      REQUIRE(a.size() <= 2);
      REQUIRE(a.front() >= steps - 1);
    } else {
      REQUIRE(advanced[static_cast<std::size_t>(r)] == std::vector<std::uint64_t>(steps, 1));
    }
    for (const auto& set : sets[static_cast<std::size_t>(r)]) REQUIRE(set == fast);
  }
  // The reference: every step the mean of the fast ranks' gradients, at that step's own rate
  // (the slow rank applied all six in one finish, each with its schedule's rate).
  auto expected = start_params();
  for (int k = 0; k < steps; ++k)
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        double sum = 0;
        for (int q : fast) sum += grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(q)][t][i];
        expected[t][i] -= 0.1 / double(1 + k) * sum / double(fast.size());
      }
  for (int r = 0; r < ranks; ++r)
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        REQUIRE(params[static_cast<std::size_t>(r)][t][i] == Approx(expected[t][i]).epsilon(1e-12).margin(1e-12));
        REQUIRE(params[static_cast<std::size_t>(r)][t][i] == params[0][t][i]);
      }
}

TEST_CASE("K of N keeps a late replica at most max_steps_behind steps behind: then the others wait for it") {
  const int ranks = 3, steps = 6, behind = 2;
  std::atomic<int> fast_steps_done{0};
  std::atomic<int> seen_while_held{-1};
  const auto grads = random_gradients(steps, ranks, 7);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int r = t.rank();
    const bool slow = r == ranks - 1;
    strategy_type s(std::move(t), start_params(), gw::optim::sgd({.lr = 0.1}),
                    gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{
                        .bucket_bytes = 256, .backup_workers = 1, .max_steps_behind = behind}));
    s.aggregation().plan_steps(steps);
    for (int k = 0; k < steps;) {
      auto step = s.begin_step();
      if (slow && k == 0) {
        // The others can finish the `behind` steps this rank's buffers hold, and not a third.
        wait_until([&] { return fast_steps_done.load() >= (ranks - 1) * behind; },
                   "the fast ranks did not get the steps the buffers allow");
        std::this_thread::sleep_for(100ms);
        seen_while_held = fast_steps_done.load();
      }
      const auto& g = grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < g.size(); ++i) step.ready(i, g[i]);
      step.finish();
      if (!slow) ++fast_steps_done;
      k += static_cast<int>(s.aggregation().last_steps_advanced());
    }
  });
  REQUIRE(seen_while_held.load() == (ranks - 1) * behind);
}

TEST_CASE("K of N: a late replica whose communicator thread finished the plan without it catches up, and opens no step again") {
  // Rank N-1's finish of step 0 returns as soon as that step is done; only then do the others
  // go on, through the rest of the plan, without it (it has not opened step 1). Its
  // communicator thread runs those steps and ends with the plan. Its next step (1) was run
  // already: it must take the others' sums, not open step 1's round a second time (which no
  // other rank would join: it hung until the step timeout).
  const int ranks = 3, steps = 4;
  const auto grads = random_gradients(steps, ranks, 11);
  std::atomic<int> fast_steps_done{0};
  std::atomic<bool> slow_finished_first{false};
  std::vector<std::vector<std::uint64_t>> advanced(static_cast<std::size_t>(ranks));
  std::vector<std::vector<gw::host_tensor<double>>> params(static_cast<std::size_t>(ranks));
  std::vector<double> after(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int r = t.rank();
    const bool slow = r == ranks - 1;
    strategy_type s(std::move(t), start_params(), gw::optim::sgd({.lr = 0.1}),
                    gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{
                        .bucket_bytes = 256, .backup_workers = 1, .max_steps_behind = steps}),
                    gw::collective::communicator_options{.timeout = 30s});  // a regression fails, not hangs 5 min
    s.aggregation().plan_steps(steps);
    for (int k = 0; k < steps;) {
      if (!slow && k == 1)
        wait_until([&] { return slow_finished_first.load(); }, "the slow rank did not finish step 0");
      if (slow && k == 1) {
        wait_until([&] { return fast_steps_done.load() >= (ranks - 1) * steps; }, "the fast ranks did not finish the plan");
        std::this_thread::sleep_for(50ms);  // its communicator thread ends the plan's job
      }
      auto step = s.begin_step();
      if (slow && k == 0)
        wait_until([&] { return fast_steps_done.load() >= ranks - 1; }, "the fast ranks did not close step 0");
      const auto& g = grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < g.size(); ++i) step.ready(i, g[i]);
      step.finish();
      if (!slow) ++fast_steps_done;
      if (slow && k == 0) slow_finished_first = true;
      advanced[static_cast<std::size_t>(r)].push_back(s.aggregation().last_steps_advanced());
      k += static_cast<int>(s.aggregation().last_steps_advanced());
    }
    double x = r + 1;
    gw::collective::all_reduce(s.communicator(), std::span<double>(&x, 1));
    after[static_cast<std::size_t>(r)] = x;
    params[static_cast<std::size_t>(r)].assign(s.parameters().begin(), s.parameters().end());
  });
  REQUIRE(advanced[ranks - 1] == std::vector<std::uint64_t>{1, steps - 1});
  auto expected = start_params();
  for (int k = 0; k < steps; ++k)
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        double sum = 0;
        for (int q = 0; q + 1 < ranks; ++q) sum += grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(q)][t][i];
        expected[t][i] -= 0.1 * sum / double(ranks - 1);
      }
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(after[static_cast<std::size_t>(r)] == double(ranks * (ranks + 1) / 2));
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        REQUIRE(params[static_cast<std::size_t>(r)][t][i] == Approx(expected[t][i]).epsilon(1e-12).margin(1e-12));
        REQUIRE(params[static_cast<std::size_t>(r)][t][i] == params[0][t][i]);
      }
  }
}

namespace {

using simulated_strategy =
    gw::strategy<gw::host_tensor<double>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::simulated>;

struct simulated_run {
  std::vector<std::vector<int>> sets;                     // [step]: rank 0's (always in)
  std::vector<std::vector<std::uint64_t>> advanced;       // [rank][finish]
  std::vector<std::vector<gw::host_tensor<double>>> params;  // [rank]
  std::vector<std::uint64_t> dropped;                     // [rank]: the cumulative stats
  gw::simulation::run_report report;
  std::vector<std::exception_ptr> outcomes;  // [rank]: null, or what it threw
};

// Every rank computes 10 ms of modelled time per step (the model's slow= factors stretch
// it) and plans all the steps, so a late rank's communicator thread goes on without it.
// A rank's failure is its outcome (the caller checks them).
simulated_run train_simulated(const std::string& model, int ranks, int steps, const grads_type& grads) {
  simulated_run out;
  out.advanced.resize(static_cast<std::size_t>(ranks));
  out.params.resize(static_cast<std::size_t>(ranks));
  out.dropped.resize(static_cast<std::size_t>(ranks));
  gw::simulation::job job(gw::simulation::parse_cluster_model(model));
  out.outcomes = job.run([&](gw::transport::simulated t) {
    const int r = t.rank();
    simulated_strategy s(std::move(t), start_params(), gw::optim::sgd({.lr = 0.1}),
                         gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{
                             .bucket_bytes = 256, .backup_workers = 1, .max_steps_behind = steps}));
    s.aggregation().plan_steps(static_cast<std::uint64_t>(steps));
    for (int k = 0; k < steps;) {
      auto step = s.begin_step();
      gw::simulation::compute(10ms);
      const auto& g = grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < g.size(); ++i) step.ready(i, g[i]);
      step.finish();
      if (r == 0) out.sets.push_back(s.aggregation().last_step_set().in);
      out.advanced[static_cast<std::size_t>(r)].push_back(s.aggregation().last_steps_advanced());
      k += static_cast<int>(s.aggregation().last_steps_advanced());
    }
    out.dropped[static_cast<std::size_t>(r)] = s.cumulative_stats().dropped;
    out.params[static_cast<std::size_t>(r)].assign(s.parameters().begin(), s.parameters().end());
  }, &out.report);
  return out;
}

}  // namespace

TEST_CASE("K of N in the simulator: a rank 3x slow is left out without being waited for, the maths holds, and a rerun is identical to the nanosecond") {
  // The late rank's communicator runs on its second virtual thread: the fast ranks' steps
  // take their own 10 ms, not the slow rank's 30 ms.
  const int ranks = GENERATE(3, 4);
  const int steps = 12;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, seed);
  const auto grads = random_gradients(steps, ranks, seed);
  const std::string model = "hosts=" + std::to_string(ranks) + " compute=modelled slow=" + std::to_string(ranks - 1) + ":3";
  const auto got = train_simulated(model, ranks, steps, grads);
  for (const auto& o : got.outcomes) REQUIRE(!o);
  REQUIRE(got.sets.size() == static_cast<std::size_t>(steps));
  std::vector<int> fast;
  for (int q = 0; q + 1 < ranks; ++q) fast.push_back(q);
  std::uint64_t slow_out = 0;
  for (const auto& set : got.sets) {
    REQUIRE(static_cast<int>(set.size()) >= ranks - 1);
    if (set == fast) ++slow_out;
  }
  // Step 0 ends with a collective of every rank (the buckets adopt rank 0's order); after
  // that, the slow rank is late for every step.
  REQUIRE(slow_out >= static_cast<std::uint64_t>(steps - 1));
  REQUIRE(got.dropped[static_cast<std::size_t>(ranks - 1)] >= 1);
  const auto& a = got.advanced[static_cast<std::size_t>(ranks - 1)];
  REQUIRE(std::accumulate(a.begin(), a.end(), std::uint64_t{0}) == steps);
  REQUIRE(a.size() < static_cast<std::size_t>(steps));  // it skipped steps the others closed without it
  for (int r = 0; r + 1 < ranks; ++r) REQUIRE(got.advanced[static_cast<std::size_t>(r)] == std::vector<std::uint64_t>(steps, 1));
  // Pace: the fast ranks run at their own 10 ms a step, well under the slow rank's 30.
  const double fast_end = std::chrono::duration<double>(got.report.rank_end[0]).count();
  CAPTURE(fast_end);
  REQUIRE(fast_end < 0.030 * steps * 0.6);
  // The float64 reference over exactly the recorded sets; every replica bit-identical.
  auto expected = start_params();
  for (std::size_t k = 0; k < got.sets.size(); ++k)
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        double sum = 0;
        for (int q : got.sets[k]) sum += grads[k][static_cast<std::size_t>(q)][t][i];
        expected[t][i] -= 0.1 * sum / double(got.sets[k].size());
      }
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    for (std::size_t t = 0; t < expected.size(); ++t)
      for (std::size_t i = 0; i < expected[t].size(); ++i) {
        REQUIRE(got.params[static_cast<std::size_t>(r)][t][i] == Approx(expected[t][i]).epsilon(1e-12).margin(1e-12));
        REQUIRE(got.params[static_cast<std::size_t>(r)][t][i] == got.params[0][t][i]);
      }
  }
  // Reproducible: the same model gives the same sets, times and parameters.
  const auto again = train_simulated(model, ranks, steps, grads);
  REQUIRE(again.sets == got.sets);
  REQUIRE(again.report.rank_end == got.report.rank_end);
  for (std::size_t t = 0; t < expected.size(); ++t)
    for (std::size_t i = 0; i < expected[t].size(); ++i) REQUIRE(again.params[0][t][i] == got.params[0][t][i]);
}

TEST_CASE("K of N in the simulator without a straggler: no step waits long for its last rank, and the maths holds") {
  const int ranks = 4, steps = 8;
  const auto grads = random_gradients(steps, ranks, 11);
  const auto got = train_simulated("hosts=4 compute=modelled", ranks, steps, grads);
  for (const auto& o : got.outcomes) REQUIRE(!o);
  REQUIRE(got.sets.size() == static_cast<std::size_t>(steps));
  for (const auto& set : got.sets) REQUIRE(static_cast<int>(set.size()) >= ranks - 1);
  for (int r = 1; r < ranks; ++r) REQUIRE(got.params[static_cast<std::size_t>(r)][1][0] == got.params[0][1][0]);
  const double end = std::chrono::duration<double>(got.report.end).count();
  CAPTURE(end);
  REQUIRE(end < 0.010 * steps * 1.5);
}

TEST_CASE("K of N in the simulator: a rank that dies mid-run takes its second thread with it, and the others fail naming it, in virtual time") {
  // The slow rank dies while its communicator thread runs steps without it: both its
  // threads end (no hang), and the others' steps fail with the loss, as on a network.
  const int ranks = 3, steps = 12;
  const auto grads = random_gradients(steps, ranks, 5);
  const bool dies_slow = GENERATE(true, false);
  const int dead = dies_slow ? 2 : 0;
  CAPTURE(dead);
  const auto got = train_simulated("hosts=3 compute=modelled slow=2:3 die=" + std::to_string(dead) + "@55ms", ranks,
                                   steps, grads);
  const auto& report = got.report;
  const auto& outcomes = got.outcomes;
  REQUIRE(report.died == std::vector<int>{dead});
  // Its second thread learnt the death at once, not at its own wait's deadline.
  REQUIRE(report.rank_end[static_cast<std::size_t>(dead)] < 80ms);
  for (int r = 0; r < ranks; ++r) {
    if (r == dead) continue;
    CAPTURE(r);
    REQUIRE(outcomes[static_cast<std::size_t>(r)]);
    const auto [kind, what] = gw::testing::error_of([&] { std::rethrow_exception(outcomes[static_cast<std::size_t>(r)]); });
    CAPTURE(what);
    REQUIRE(kind == gw::errc::peer_lost);
    REQUIRE_THAT(what, Catch::Contains("rank " + std::to_string(dead)));
    // It learnt the loss soon after the death: one latency, and the step it was in.
    REQUIRE(report.rank_end[static_cast<std::size_t>(r)] < 80ms);
  }
}

TEST_CASE("K of N refuses backups it cannot honour, naming the option") {
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    auto make = [&](int backups) {
      strategy_type s(t, start_params(), gw::optim::sgd({.lr = 0.1}),
                      gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{.backup_workers = backups}));
    };
    const auto too_many = gw::testing::outcome_of([&] { make(2); });
    if (too_many.kind != gw::errc::config || too_many.what.find("backup_workers = 2 needs more ranks than backups") ==
                                                 std::string::npos)
      throw std::runtime_error("backup_workers = 2 on 2 ranks: " + too_many.what);
  });
  const auto [kind, what] = gw::testing::error_of([] {
    gw::aggregation::all_reduce_agent<gw::collective::auto_, double, gw::transport::inproc> agent(
        gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{.backup_workers = -1}));
  });
  REQUIRE(kind == gw::errc::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("backup_workers = -1 must be >= 0"));
}
