// strategy::begin_step / step.ready / step.unused / step.finish: every aggregation, any ready order, errors, accumulation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <gradwire/gradwire.hpp>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/errors.hpp"

namespace gw = gradwire;
using gradwire::test::require_close;

namespace {

// A model of several tensors (one empty, one large enough for several buckets) whose
// gradient on rank r at step k is linear in the parameters: g = c_r * p + d(r, k, i, j).
// The float64 reference below replays synchronous SGD on the mean gradient serially.
const std::vector<std::size_t> sizes{37, 0, 1, 300, 5, 1024, 3};

double shift(int rank, int step, std::size_t tensor, std::size_t j) {
  return std::sin(0.37 * double(j) + 1.3 * double(tensor) + 0.71 * rank + 0.19 * step);
}
double slope(int rank) { return 0.5 + 0.25 * rank; }

std::vector<float> gradient(int rank, int step, std::size_t tensor, const float* p, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t j = 0; j < n; ++j) g[j] = float(slope(rank) * double(p[j]) + shift(rank, step, tensor, j));
  return g;
}

std::vector<gw::host_tensor<float>> make_params(int rank) {
  std::vector<gw::host_tensor<float>> out;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    out.emplace_back(gw::shape{sizes[t]});
    for (std::size_t j = 0; j < sizes[t]; ++j) out.back().data()[j] = float(0.1 * std::cos(double(j + t)) + rank);
  }
  return out;
}

using params_t = std::vector<std::vector<double>>;

// Synchronous SGD with the mean over `ranks` of each rank's gradient; `unused(t)`: tensor t
// contributes zero on the ranks for which it returns true.
// Replicas start from rank `start`'s parameters (the one setup broadcasts).
template <class Unused>
params_t reference(int ranks, int steps, double lr, Unused unused, int start = 0) {
  params_t p;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    p.emplace_back(sizes[t]);
    for (std::size_t j = 0; j < sizes[t]; ++j) p[t][j] = double(float(0.1 * std::cos(double(j + t)) + start));
  }
  for (int k = 0; k < steps; ++k)
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::vector<double> mean(sizes[t], 0.0);
      for (int r = 0; r < ranks; ++r)
        if (!unused(r, k, t))
          for (std::size_t j = 0; j < sizes[t]; ++j) mean[j] += (slope(r) * p[t][j] + shift(r, k, t, j)) / ranks;
      for (std::size_t j = 0; j < sizes[t]; ++j) p[t][j] -= lr * mean[j];
    }
  return p;
}
params_t reference(int ranks, int steps, double lr, int start = 0) {
  return reference(ranks, steps, lr, [](int, int, std::size_t) { return false; }, start);
}

template <class Strategy>
params_t snapshot(Strategy& s) {
  params_t out;
  for (auto& t : s.parameters()) out.emplace_back(t.data(), t.data() + t.size());
  return out;
}

// One step through the incremental API, in a random order of this rank's own (a fresh
// shuffle per rank and step), optionally from two threads at once.
template <class Strategy>
void incremental_step(Strategy& s, int step, std::mt19937& gen, bool two_threads) {
  const int r = s.rank();
  std::vector<std::vector<float>> grads;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    grads.push_back(gradient(r, step, t, s.parameters()[t].data(), sizes[t]));
  std::vector<std::size_t> order(sizes.size());
  for (std::size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::shuffle(order.begin(), order.end(), gen);
  auto pending = s.begin_step();
  if (two_threads) {
    std::thread other([&] {
      for (std::size_t k = 0; k < order.size(); k += 2) pending.ready(order[k], grads[order[k]]);
    });
    for (std::size_t k = 1; k < order.size(); k += 2) pending.ready(order[k], grads[order[k]]);
    other.join();
  } else {
    for (std::size_t t : order) pending.ready(t, grads[t]);
  }
  pending.finish();
}

// Trains `steps` incremental steps on `ranks` inproc ranks with the aggregation make()
// returns; returns every rank's final parameters (servers' entries stay empty).
template <class Strategy, class Make>
std::vector<params_t> train(int ranks, int steps, double lr, Make make, bool two_threads = false) {
  std::vector<params_t> out(static_cast<std::size_t>(ranks));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    Strategy s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}), make(), {.timeout = std::chrono::seconds(60)});
    if (s.is_server()) {
      if constexpr (requires { s.serve(); }) s.serve();
      return;
    }
    std::mt19937 gen(std::random_device{}() + unsigned(t.rank()));
    for (int k = 0; k < steps; ++k) incremental_step(s, k, gen, two_threads);
    out[static_cast<std::size_t>(t.rank())] = snapshot(s);
  });
  return out;
}

template <class A>
using strategy_of = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, A, gw::transport::inproc>;

// A whole-step aggregation written the old way (as the tutorial's top-k was): every gradient
// all-reduced on its own at finish.
struct naive_mean {
  template <class Tr, class V>
  void setup(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) gw::collective::broadcast(comm, p, 0);
  }
  template <class Tr, class V, class Apply>
  void step(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>>,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      sum.assign(grads[i].begin(), grads[i].end());
      gw::collective::all_reduce(comm, std::span<V>(sum));
      apply(i, std::span<const V>(sum), V(1) / V(comm.size()));
    }
  }
  std::vector<float> sum;
};
static_assert(gw::concepts::whole_step_aggregation<naive_mean, float, gw::transport::inproc>);
static_assert(!gw::concepts::incremental_aggregation<naive_mean, float, gw::transport::inproc>);

constexpr double lr = 0.05;
constexpr int steps = 4;

// inproc that also counts, in an atomic another thread may read, the bytes this rank has
// started sending. traffic() may not be read while the communicator's background thread
// runs a queued collective (async_engine.hpp: only that thread uses the communicator then);
// this count may, so the test can watch a reduction start before finish().
struct watched_inproc : gw::transport::inproc {
  watched_inproc(gw::transport::inproc t, std::atomic<std::size_t>& sent) : inproc(std::move(t)), sent_(&sent) {}
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    sent_->fetch_add(bytes.size(), std::memory_order_relaxed);
    return inproc::async_send(peer, tag, bytes);
  }
  std::atomic<std::size_t>* sent_;
};
static_assert(gw::concepts::transport<watched_inproc>);

}  // namespace

TEST_CASE("incremental steps in any order, from any thread, match synchronous SGD for every aggregation") {
  const bool two_threads = GENERATE(false, true);
  CAPTURE(two_threads);
  SECTION("all_reduce, buckets of 256 bytes (many buckets, launched during the step)") {
    const int ranks = GENERATE(2, 3);
    const auto got = train<strategy_of<gw::aggregation::all_reduce>>(
        ranks, steps, lr, [] { return gw::aggregation::all_reduce(256); }, two_threads);
    for (const auto& p : got) require_close(p, reference(ranks, steps, lr));
    for (const auto& p : got) REQUIRE(p == got[0]);  // bit-identical replicas
  }
  SECTION("all_reduce, default buckets (one bucket: reduced at finish)") {
    const auto got = train<strategy_of<gw::aggregation::all_reduce>>(
        3, steps, lr, [] { return gw::aggregation::all_reduce(); }, two_threads);
    for (const auto& p : got) require_close(p, reference(3, steps, lr));
  }
  SECTION("central storage, owner 1, buckets of 512 bytes") {
    const auto got = train<strategy_of<gw::aggregation::central>>(
        3, steps, lr, [] { return gw::aggregation::central(1, 512); }, two_threads);
    for (const auto& p : got) require_close(p, reference(3, steps, lr, 1));  // the owner's start
    for (const auto& p : got) REQUIRE(p == got[0]);
  }
  SECTION("averaging<1> with plain SGD (local steps, then the mean of the parameters)") {
    const auto got = train<strategy_of<gw::aggregation::averaging<1>>>(
        3, steps, lr, [] { return gw::aggregation::averaging<1>(); }, two_threads);
    for (const auto& p : got) require_close(p, reference(3, steps, lr));
  }
  SECTION("local (one replica)") {
    const auto got = train<strategy_of<gw::aggregation::local>>(
        1, steps, lr, [] { return gw::aggregation::local(); }, two_threads);
    require_close(got[0], reference(1, steps, lr));
  }
  SECTION("parameter_server<sync>: 2 workers, 1 server") {
    const auto got = train<strategy_of<gw::aggregation::parameter_server<gw::ps::sync>>>(
        3, steps, lr, [] {
          gw::ps::options o;
          o.servers = 1;
          o.split_bytes = 512;
          return gw::aggregation::parameter_server<gw::ps::sync>(o);
        },
        two_threads);
    for (int r = 0; r < 2; ++r) require_close(got[r], reference(2, steps, lr));
  }
  SECTION("a user's whole-step aggregation (wrapped: it communicates at finish)") {
    const auto got =
        train<strategy_of<naive_mean>>(2, steps, lr, [] { return naive_mean(); }, two_threads);
    for (const auto& p : got) require_close(p, reference(2, steps, lr));
  }
}

TEST_CASE("step(grads) and the incremental API take the same steps") {
  std::vector<params_t> one_call(2), incremental(2);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    using S = strategy_of<gw::aggregation::all_reduce>;
    S a(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}), gw::aggregation::all_reduce(256));
    for (int k = 0; k < steps; ++k) {
      std::vector<std::vector<float>> grads;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        grads.push_back(gradient(t.rank(), k, i, a.parameters()[i].data(), sizes[i]));
      a.step(grads);
    }
    one_call[t.rank()] = snapshot(a);
  });
  for (const auto& p : one_call) require_close(p, reference(2, steps, lr));
}

TEST_CASE("a tensor declared unused counts as a zero gradient, on the ranks that declare it") {
  constexpr int ranks = 3;
  // Tensor 3 unused on rank 1 at every step; tensor 0 unused on every rank at step 2.
  auto unused = [](int r, int k, std::size_t t) { return (t == 3 && r == 1) || (t == 0 && k == 2); };
  std::vector<params_t> got(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(256));
    for (int k = 0; k < steps; ++k) {
      auto step = s.begin_step();
      for (std::size_t i = sizes.size(); i-- > 0;) {
        if (unused(t.rank(), k, i)) {
          step.unused(i);
        } else {
          auto g = gradient(t.rank(), k, i, s.parameters()[i].data(), sizes[i]);
          step.ready(i, g);
        }
      }
      step.finish();
    }
    got[t.rank()] = snapshot(s);
  });
  const auto want = reference(ranks, steps, lr, unused);
  for (const auto& p : got) require_close(p, want);
  // Not vacuous: without the zero contributions the result differs.
  REQUIRE(std::abs(want[3][0] - reference(ranks, steps, lr)[3][0]) > 1e-3);
}

TEST_CASE("a rank that never marks an unused tensor makes the others time out at the step timeout, and it is told which tensor") {
  // Tensor 3 is unused this step: ranks 0 and 1 say so (step.unused), rank 2 says nothing and
  // keeps its step open until both others have failed (docs/strategies/incremental_step.md:
  // "a rank that says nothing makes the others wait until the step timeout").
  constexpr int ranks = 3, silent = 2;
  constexpr std::size_t forgotten = 3;
  constexpr auto step_timeout = std::chrono::seconds(1);
  struct outcome {
    gw::errc kind{};
    std::string what = "no error";
    std::chrono::steady_clock::duration took{};
  };
  std::vector<outcome> got(ranks);
  std::mutex m;
  std::condition_variable cv;
  int failed = 0;  // ranks other than the silent one whose finish() has returned or thrown
  gw::transport::inproc_group group(ranks);
  const auto raw = group.run([&](gw::transport::inproc t) {
    const int me = t.rank();
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(me), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(256), {.timeout = step_timeout});
    // From the step's start: tensor 3's bucket goes out (and its wait begins) before finish().
    const auto began = std::chrono::steady_clock::now();
    auto step = s.begin_step();
    for (std::size_t i = sizes.size(); i-- > 0;) {
      if (i != forgotten)
        step.ready(i, gradient(me, 0, i, s.parameters()[i].data(), sizes[i]));
      else if (me != silent)
        step.unused(i);
    }
    auto record = [&](auto&& fn) {
      try {
        fn();
      } catch (const gw::error& e) {
        got[me] = {e.kind(), e.what(), {}};
      }
      got[me].took = std::chrono::steady_clock::now() - began;
    };
    if (me != silent) {
      record([&] { step.finish(); });
      std::lock_guard lock(m);
      ++failed;
      cv.notify_all();
      return;
    }
    // The silent rank: alive, its step open, until the others gave up (or 20 s passed, when
    // it fails its transport so that they stop waiting: the test then fails, it does not hang).
    std::unique_lock lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return failed == ranks - 1; })) {
      s.communicator().transport().fail(gw::errc::peer_lost, "test: the other ranks did not give up in 20 s");
      return;
    }
    lock.unlock();
    record([&] { step.finish(); });  // its own mistake, named locally
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, got[r].what);
    REQUIRE_FALSE(raw[r]);
    if (r == silent) {
      REQUIRE(got[r].kind == gw::errc::invalid_argument);
      REQUIRE_THAT(got[r].what, Catch::Contains("step.finish() on rank 2: gradient 3 (parameter of shape [300]) "
                                                "never marked ready"));
      continue;
    }
    // Each waited for rank 2 in the all-reduce of tensor 3's bucket and gave up at the step
    // deadline, naming rank 2 (docs/errors.md, timeout); finish() waits for that bucket
    // longer than the reduction's own deadline, so that error is the one it reports. The
    // first to time out fails the job, so the other may see its timeout as a lost peer.
    const std::string missed = "receive from rank 2 (tag ";
    const std::string who = "rank " + std::to_string(r) + ": ";
    if (got[r].kind == gw::errc::timeout) {
      REQUIRE_THAT(got[r].what, Catch::StartsWith(who + missed) &&
                                    Catch::Contains("did not complete before its deadline (is a rank missing or behind?)"));
    } else {
      REQUIRE(got[r].kind == gw::errc::peer_lost);
      REQUIRE_THAT(got[r].what, Catch::StartsWith(who) && Catch::Contains(" failed: rank ") &&
                                    Catch::Contains(": " + missed) && Catch::Contains("did not complete before its deadline"));
    }
    REQUIRE(got[r].took >= step_timeout);
    REQUIRE(got[r].took < step_timeout + std::chrono::seconds(8));
  }
}

TEST_CASE("incremental API errors: never ready, ready twice, bad index or size, overlapping steps") {
  using S = gw::one_device<gw::host_tensor<float>, gw::optim::sgd>;
  S s(make_params(0), gw::optim::sgd({.lr = lr}));
  std::vector<float> g3(sizes[3], 1.0f), g0(sizes[0], 1.0f);
  // Every refusal is a local invalid_argument (docs/errors.md, "Tensors passed to a step").
  auto require_refusal = [](auto&& call, const auto& words) {
    const auto [kind, what] = gw::testing::error_of(call);
    CAPTURE(what);
    REQUIRE(kind == gw::errc::invalid_argument);
    REQUIRE_THAT(what, words);
  };
  SECTION("a tensor never marked ready is named by finish()") {
    auto step = s.begin_step();
    for (std::size_t i = 0; i < sizes.size(); ++i)
      if (i != 3 && i != 5) step.ready(i, std::vector<float>(sizes[i], 0.5f));
    require_refusal([&] { step.finish(); },
                    Catch::Contains("step.finish() on rank 0: gradient 3 (parameter of shape [300])") &&
                        Catch::Contains("gradient 5 (parameter of shape [1024])") &&
                        Catch::Contains("never marked ready") && Catch::Contains("step.unused(i)"));
    // The step is over: the strategy takes the next one, and the parameters did not move.
    REQUIRE(s.parameters()[3].data()[0] == make_params(0)[3].data()[0]);
    auto next = s.begin_step();
    for (std::size_t i = 0; i < sizes.size(); ++i) next.unused(i);
    next.finish();
  }
  SECTION("a tensor marked twice") {
    auto step = s.begin_step();
    step.ready(3, g3);
    require_refusal([&] { step.ready(3, g3); },
                    Catch::Contains("gradient 3 (parameter of shape [300]) was marked ready twice in this step"));
    require_refusal([&] { step.unused(3); }, Catch::Contains("gradient 3 (parameter of shape [300]) was marked ready twice"));
    step.unused(0);
    require_refusal([&] { step.ready(0, g0); },
                    Catch::Contains("gradient 0 (parameter of shape [37]) was marked unused twice"));
  }
  SECTION("an index outside the model, a gradient of the wrong size") {
    auto step = s.begin_step();
    require_refusal([&] { step.ready(7, g3); },
                    Catch::Contains("step.ready(7): the model has 7 parameter tensors"));
    require_refusal([&] { step.unused(9); }, Catch::Contains("step.unused(9): the model has 7 parameter tensors"));
    require_refusal([&] { step.ready(0, g3); },
                    Catch::Contains("step.ready: gradient 0 has 300 elements but parameter 0 has 37"));
  }
  SECTION("one step at a time; a finished handle refuses more") {
    auto step = s.begin_step();
    require_refusal([&] { (void)s.begin_step(); }, Catch::Contains("a step is already in progress on rank 0"));
    for (std::size_t i = 0; i < sizes.size(); ++i) step.unused(i);
    step.finish();
    require_refusal([&] { step.ready(0, g0); }, Catch::Contains("step.ready() on a step that has finished"));
    require_refusal([&] { step.finish(); }, Catch::Contains("step.finish() on a step that has finished"));
  }
  SECTION("a handle dropped before finish() gives the step up") {
    {
      auto step = s.begin_step();
      step.ready(3, g3);
    }
    auto step = s.begin_step();  // not "already in progress"
    for (std::size_t i = 0; i < sizes.size(); ++i) step.unused(i);
    step.finish();
  }
}

TEST_CASE("a bucket's all-reduce starts as soon as its last tensor is ready, before finish()") {
  // Two tensors, buckets of one tensor each: backward order puts tensor 1 in bucket 0.
  // What each rank saw, asserted on the main thread (Catch2 v2 asserts there only).
  struct seen {
    std::size_t buckets = 0;
    std::size_t sent_before_finish = 0;  // bytes sent between ready(1) and ready(0)
    float first_parameter = 0.0f;
  };
  std::vector<seen> got(2);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{4096});
    params.emplace_back(gw::shape{4096});
    std::atomic<std::size_t> sent{0};
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, watched_inproc> s(
        watched_inproc(t, sent), std::move(params), gw::optim::sgd({.lr = lr}),
        gw::aggregation::all_reduce(4096 * sizeof(float)));
    got[t.rank()].buckets = s.aggregation().buckets().size();
    std::vector<float> g(4096, 1.0f);
    auto step = s.begin_step();
    const auto before = sent.load();
    step.ready(1, g);
    // The reduction of bucket 0 runs on the communicator's background thread meanwhile.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (sent.load() < before + 4096 * sizeof(float) / 2 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    got[t.rank()].sent_before_finish = sent.load() - before;
    step.ready(0, g);
    step.finish();
    got[t.rank()].first_parameter = s.parameters()[0].data()[0];
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(got[r].buckets == 2);
    REQUIRE(got[r].sent_before_finish >= 4096 * sizeof(float) / 2);
    REQUIRE(got[r].first_parameter == Approx(-lr));
  }
}

TEST_CASE("buckets are rebuilt once, in the order rank 0 produced its gradients in the first step") {
  // Each rank's bucket order at construction and after each of 2 steps, asserted below.
  std::vector<std::vector<std::vector<std::size_t>>> orders(3);
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(512));
    auto order_now = [&] {
      const auto o = s.aggregation().layout().order();
      return std::vector<std::size_t>(o.begin(), o.end());
    };
    orders[t.rank()].push_back(order_now());
    // Rank 0 marks 2, 0, 4, 6, 1, 3, 5; the others their own orders.
    const std::vector<std::size_t> mine = t.rank() == 0 ? std::vector<std::size_t>{2, 0, 4, 6, 1, 3, 5}
                                                        : std::vector<std::size_t>{6, 5, 4, 3, 2, 1, 0};
    for (int k = 0; k < 2; ++k) {
      auto step = s.begin_step();
      for (std::size_t i : (k == 0 ? mine : std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6}))
        step.ready(i, gradient(t.rank(), k, i, s.parameters()[i].data(), sizes[i]));
      step.finish();
      orders[t.rank()].push_back(order_now());
    }
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(orders[r].size() == 3);
    REQUIRE(orders[r][0][0] == sizes.size() - 1);  // reverse parameter order at first
    // Rank 0's order after step 1, and not rebuilt again after step 2.
    REQUIRE(orders[r][1] == std::vector<std::size_t>{2, 0, 4, 6, 1, 3, 5});
    REQUIRE(orders[r][2] == std::vector<std::size_t>{2, 0, 4, 6, 1, 3, 5});
  }
}

TEST_CASE("gradient accumulation: K micro-batches with no_sync equal one step on the K-times batch") {
  const int micro = GENERATE(2, 3);
  CAPTURE(micro);
  constexpr int ranks = 2;
  // Micro-batch m of step k on rank r is the gradient of "rank" r * micro + m of a job of
  // ranks * micro replicas: the reference of that larger job is the K-times batch.
  std::vector<params_t> got(ranks);
  std::vector<std::uint64_t> bytes_in_micro(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(0), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(1024));
    for (int k = 0; k < steps; ++k)
      for (int m = 0; m < micro; ++m) {
        const int replica = t.rank() * micro + m;
        const bool last = m + 1 == micro;
        const auto sent = s.communicator().transport().traffic().bytes_sent;
        auto step = last ? s.begin_step() : s.begin_step(gw::no_sync);
        for (std::size_t i = sizes.size(); i-- > 0;)
          step.ready(i, gradient(replica, k, i, s.parameters()[i].data(), sizes[i]));
        step.finish();
        if (!last) bytes_in_micro[t.rank()] += s.communicator().transport().traffic().bytes_sent - sent;
      }
    got[t.rank()] = snapshot(s);
  });
  // The reference replicas all start where rank 0 starts (make_params(0) on every rank here).
  const auto want = reference(ranks * micro, steps, lr);
  for (const auto& p : got) require_close(p, want);
  for (auto b : bytes_in_micro) REQUIRE(b == 0);  // micro-batches communicate nothing
}

TEST_CASE("gradient accumulation through the one-call form and with the parameter server") {
  constexpr int micro = 2;
  SECTION("step(grads, no_sync), all_reduce") {
    std::vector<params_t> got(2);
    // accumulated_micro_batches() after each call, per rank: 1, 0, 1, 0, ... expected.
    std::vector<std::vector<std::size_t>> waiting(2);
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      strategy_of<gw::aggregation::all_reduce> s(t, make_params(0), gw::optim::sgd({.lr = lr}));
      for (int k = 0; k < steps; ++k)
        for (int m = 0; m < micro; ++m) {
          std::vector<std::vector<float>> grads;
          for (std::size_t i = 0; i < sizes.size(); ++i)
            grads.push_back(gradient(t.rank() * micro + m, k, i, s.parameters()[i].data(), sizes[i]));
          if (m + 1 < micro)
            s.step(grads, gw::no_sync);
          else
            s.step(grads);
          waiting[t.rank()].push_back(s.accumulated_micro_batches());
        }
      got[t.rank()] = snapshot(s);
    });
    std::vector<std::size_t> want;
    for (int k = 0; k < steps; ++k)
      for (int m = 0; m < micro; ++m) want.push_back(m + 1 < micro ? std::size_t(m + 1) : 0);
    for (const auto& w : waiting) REQUIRE(w == want);
    for (const auto& p : got) require_close(p, reference(2 * micro, steps, lr));
  }
}

TEST_CASE("a step given up after no_sync micro-batches discards them: the next step applies only its own gradients") {
  // Each way a step can be given up. Several ranks: only before any gradient of the
  // synchronised step is handed over (after that the ranks are out of step, tested below);
  // one rank alone cannot fall out of step, so there the step is given up midway, after
  // ready() has folded the micro-batches into some tensors' gradients.
  const int ranks = GENERATE(1, 2);
  CAPTURE(ranks);
  constexpr int micro = 3;
  const std::size_t handed_over = ranks == 1 ? sizes.size() - 2 : 0;  // tensors marked before giving up
  // Micro-batch m's gradient: far from the clean step's (another "rank" and step), so that
  // folding any of it into the clean step moves the parameters well past the tolerance.
  auto micro_gradient = [](const auto& s, int m, std::size_t i) {
    return gradient(10 + 3 * s.rank() + m, 7 + m, i, s.parameters()[i].data(), sizes[i]);
  };
  auto hand_over_some = [&](auto& s, auto& step) {
    for (std::size_t i = sizes.size(); i-- > sizes.size() - handed_over;)
      step.ready(i, gradient(s.rank(), 0, i, s.parameters()[i].data(), sizes[i]));
  };
  enum class way { dropped, finish_refused, micro_batch_dropped, one_call_refused };
  way how = way::dropped;
  SECTION("the synchronised step's handle dropped") { how = way::dropped; }
  SECTION("the synchronised step's finish() refused: a gradient never marked ready") { how = way::finish_refused; }
  SECTION("a further micro-batch's handle dropped (the documented discard of every no_sync step)") {
    how = way::micro_batch_dropped;
  }
  SECTION("the one-call step refused: a NaN gradient with the finite check on (one rank)") {
    if (ranks != 1) return;  // on several ranks a NaN fails the job (test_bad_input.cpp)
    how = way::one_call_refused;
  }
  std::vector<params_t> got(static_cast<std::size_t>(ranks));
  std::vector<std::size_t> before(got.size()), after(got.size());
  std::vector<std::string> refused(got.size());
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const auto r = static_cast<std::size_t>(t.rank());
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(256));
    // The micro-batches, through both forms: the one-call step first, then incremental ones.
    for (int m = 0; m < micro; ++m) {
      std::vector<std::vector<float>> grads;
      for (std::size_t i = 0; i < sizes.size(); ++i) grads.push_back(micro_gradient(s, m, i));
      if (m == 0) {
        s.step(grads, gw::no_sync);
        continue;
      }
      auto step = s.begin_step(gw::no_sync);
      for (std::size_t i = sizes.size(); i-- > 0;) step.ready(i, grads[i]);
      step.finish();
    }
    before[r] = s.accumulated_micro_batches();
    switch (how) {
      case way::dropped: {
        auto step = s.begin_step();
        hand_over_some(s, step);
      } break;  // dropped here
      case way::finish_refused: {
        auto step = s.begin_step();
        hand_over_some(s, step);
        try {
          step.finish();
        } catch (const gw::error& e) {
          refused[r] = e.what();
        }
      } break;
      case way::micro_batch_dropped: {
        auto step = s.begin_step(gw::no_sync);
        step.ready(sizes.size() - 1, micro_gradient(s, micro, sizes.size() - 1));
      } break;
      case way::one_call_refused: {
        std::vector<std::vector<float>> grads;
        for (std::size_t i = 0; i < sizes.size(); ++i)
          grads.push_back(gradient(s.rank(), 0, i, s.parameters()[i].data(), sizes[i]));
        grads[0][5] = std::nanf("");  // tensor 0 is handed over last: the others were folded
        s.check_finite_gradients(true);
        try {
          s.step(grads);
        } catch (const gw::error& e) {
          refused[r] = e.what();
        }
        s.check_finite_gradients(false);
      } break;
    }
    after[r] = s.accumulated_micro_batches();
    // The clean step: rank r's gradient of step 0, as in the reference.
    std::mt19937 gen(std::random_device{}() + unsigned(t.rank()));
    incremental_step(s, 0, gen, false);
    got[r] = snapshot(s);
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, refused[r]);
    REQUIRE(before[r] == std::size_t{micro});  // the micro-batches were accumulated
    if (how == way::finish_refused) REQUIRE_THAT(refused[r], Catch::Contains("never marked ready"));
    if (how == way::one_call_refused) REQUIRE_THAT(refused[r], Catch::Contains("holds nan"));
    // One synchronous SGD step on the clean gradients only (replicas start at rank 0's).
    require_close(got[r], reference(ranks, 1, lr));
    REQUIRE(after[r] == 0);  // and the count says so
  }
}

TEST_CASE("a step given up after its gradients went out leaves the ranks out of step: later steps refuse") {
  // Each rank's refusals of begin_step() and of step(grads), asserted on the main thread.
  std::vector<std::pair<gw::errc, std::string>> begin(2), one_call(2);
  auto error_of = [](auto&& fn) -> std::pair<gw::errc, std::string> {
    try {
      fn();
    } catch (const gw::error& e) {
      return {e.kind(), e.what()};
    }
    return {gw::errc{}, "no error"};
  };
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(256));
    {
      // Every tensor but 0: the buckets before tensor 0's are launched on both ranks.
      auto step = s.begin_step();
      for (std::size_t i = sizes.size(); i-- > 1;)
        step.ready(i, gradient(t.rank(), 0, i, s.parameters()[i].data(), sizes[i]));
    }  // dropped: its reductions may have started
    begin[t.rank()] = error_of([&] { (void)s.begin_step(); });
    std::vector<std::vector<float>> grads;
    for (std::size_t n : sizes) grads.emplace_back(n, 0.0f);
    one_call[t.rank()] = error_of([&] { s.step(grads); });
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, begin[r].second, one_call[r].second);
    const std::string who = "strategy: rank " + std::to_string(r) + " cannot step with the other ranks any more";
    REQUIRE(begin[r].first == gw::errc::mismatch);
    REQUIRE_THAT(begin[r].second, Catch::Contains(who) && Catch::Contains("restart the job"));
    REQUIRE(one_call[r].first == gw::errc::mismatch);
    REQUIRE_THAT(one_call[r].second, Catch::Contains(who));
  }
}

TEST_CASE("a handle dropped before any gradient was handed over costs nothing") {
  std::vector<params_t> got(2);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    strategy_of<gw::aggregation::all_reduce> s(t, make_params(t.rank()), gw::optim::sgd({.lr = lr}),
                                               gw::aggregation::all_reduce(256));
    { auto dropped = s.begin_step(); }
    std::mt19937 gen(std::random_device{}() + unsigned(t.rank()));
    for (int k = 0; k < steps; ++k) incremental_step(s, k, gen, false);
    got[t.rank()] = snapshot(s);
  });
  for (const auto& p : got) require_close(p, reference(2, steps, lr));
}
