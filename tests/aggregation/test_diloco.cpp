// DiLoCo (aggregation::averaging<H, Outer>): outer SGD at lr 1 is local SGD, Nesterov and streaming against float64 references.
#include <catch2/catch.hpp>

#include "aggregation/diloco_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <gradwire/aggregation/diloco.hpp>
#include <gradwire/compress/codecs.hpp>
#include <gradwire/gradwire.hpp>
#include <gradwire/strategies/diloco.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#if GRADWIRE_HAS_ASIO
#include "helpers/tcp_threads.hpp"
#endif

namespace gw = gradwire;
namespace agg = gw::aggregation;

static_assert(gw::concepts::aggregation<agg::averaging<4, gw::optim::momentum>, float, gw::transport::inproc>);
static_assert(gw::concepts::aggregation<agg::averaging<agg::dynamic_period, gw::optim::adam>, double,
                                        gw::transport::local>);
static_assert(agg::averaging<4, gw::optim::sgd>::has_outer && !agg::averaging<4>::has_outer);
static_assert(gw::diloco<gw::host_tensor<float>, gw::optim::adamw, 16>::aggregation_type::period == 16);
static_assert(std::is_same_v<gw::diloco<gw::host_tensor<float>, gw::optim::adamw, 16>::aggregation_type,
                             agg::averaging<16, gw::optim::momentum>>);
// With an outer optimizer the optimizer is given, never defaulted (optim::momentum's own
// defaults are not DiLoCo's): aggregation::diloco<H>() gives the paper's.
static_assert(!std::is_default_constructible_v<agg::averaging<4, gw::optim::momentum>>);
static_assert(std::is_constructible_v<agg::averaging<4, gw::optim::momentum>, gw::optim::momentum>);
static_assert(std::is_constructible_v<agg::averaging<>, int>);  // today's run-time period, unchanged

namespace {
using namespace gradwire::testing::diloco;  // the model, its data, each rank's parameters
using gradwire::testing::batch_data;
using reference_t = std::vector<std::vector<std::vector<double>>>;  // [step][rank][element]

// One replica's run: `steps` steps on its own data, its parameters after each.
template <class Strategy, class Transport, class MakeAggregation>
void replica(Transport t, const std::vector<std::vector<batch_data>>& data, const typename Strategy::optimizer_type& opt,
             const MakeAggregation& make, history_t& history) {
  const int rank = t.rank();
  Strategy s(std::move(t), make_params(rank), opt, make());
  for (std::size_t k = 0; k < data.size(); ++k) {
    auto p = s.parameters();
    s.step(model.gradients(p[0].data(), p[1].data(), data[k][static_cast<std::size_t>(rank)]));
    history[k][static_cast<std::size_t>(rank)] = snapshot(s);
  }
  s.flush();  // streamed: the updates still pending land (after the last snapshot), so it ends without a warning
}

// Trains on `ranks` inproc threads; the aggregation is built on each rank by make().
template <class Strategy, class MakeAggregation>
history_t train(int ranks, const std::vector<std::vector<batch_data>>& data,
                const typename Strategy::optimizer_type& opt, MakeAggregation make) {
  history_t history(data.size(), std::vector<flat_t>(static_cast<std::size_t>(ranks)));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) { replica<Strategy>(t, data, opt, make, history); });
  return history;
}

// The DiLoCo algorithm, serial, in float64, written from the paper rather than from the
// implementation: inner SGD on every replica; fragment f (elements [f*T/F, (f+1)*T/F))
// takes its pseudo-gradient mean_r(theta - theta_r) after step s when s % H == f*H/F; the
// outer SGD with (Nesterov) momentum steps theta with it after step s + delay, and every
// replica's fragment becomes theta's. flush_at_end: after the last step, the updates still
// pending land too (strategy::flush()), one entry more at the end.
struct schedule {
  int period, fragments = 1, delay = 0;
  double inner_lr = 0.1, outer_lr = 0.7, momentum = 0.9;
  bool nesterov = true;
  std::size_t lo(int f) const { return static_cast<std::size_t>(f) * total / static_cast<std::size_t>(fragments); }
  bool starts(int f, int step) const { return step % period == f * period / fragments; }
};

reference_t reference(int ranks, const std::vector<std::vector<batch_data>>& data, const schedule& c,
                      bool flush_at_end = false) {
  std::vector<double> theta = initial<double>(0), velocity(total, 0.0);
  std::vector<std::vector<double>> replicas(static_cast<std::size_t>(ranks), theta);
  struct pending {
    int lands;
    std::vector<double> delta;
  };
  std::vector<std::optional<pending>> flight(static_cast<std::size_t>(c.fragments));
  reference_t out;
  for (int s = 1; s <= static_cast<int>(data.size()); ++s) {
    for (int r = 0; r < ranks; ++r) {
      auto& w = replicas[static_cast<std::size_t>(r)];
      const auto g = model.gradients(w.data(), w.data() + outputs * inputs, data[s - 1][static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < outputs * inputs; ++i) w[i] -= c.inner_lr * g[0][i];
      for (std::size_t i = 0; i < outputs; ++i) w[outputs * inputs + i] -= c.inner_lr * g[1][i];
    }
    for (int f = 0; f < c.fragments; ++f) {
      if (!c.starts(f, s)) continue;
      pending p{s + c.delay, {}};
      for (std::size_t e = c.lo(f); e < c.lo(f + 1); ++e) {
        double mean = 0;
        for (const auto& w : replicas) mean += (theta[e] - w[e]) / ranks;
        p.delta.push_back(mean);
      }
      flight[static_cast<std::size_t>(f)] = p;
    }
    auto land = [&](int f) {
      auto& p = flight[static_cast<std::size_t>(f)];
      for (std::size_t e = c.lo(f); e < c.lo(f + 1); ++e) {
        const double d = p->delta[e - c.lo(f)];
        velocity[e] = c.momentum * velocity[e] + d;
        theta[e] -= c.outer_lr * (c.nesterov ? d + c.momentum * velocity[e] : velocity[e]);
        for (auto& w : replicas) w[e] = theta[e];
      }
      p.reset();
    };
    for (int f = 0; f < c.fragments; ++f)
      if (flight[static_cast<std::size_t>(f)] && flight[static_cast<std::size_t>(f)]->lands == s) land(f);
    out.push_back(replicas);
    if (flush_at_end && s == static_cast<int>(data.size())) {
      for (int f = 0; f < c.fragments; ++f)
        if (flight[static_cast<std::size_t>(f)]) land(f);
      out.push_back(replicas);
    }
  }
  return out;
}

// Every replica after every step against the reference; returns the largest relative error.
double compare(const history_t& got, const reference_t& want) {
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k)
    for (std::size_t r = 0; r < got[k].size(); ++r)
      for (std::size_t e = 0; e < total; ++e) {
        CAPTURE(k + 1, r, e);
        REQUIRE(got[k][r][e] == Approx(want[k][r][e]).epsilon(1e-5).margin(1e-6));
        worst = std::max(worst, std::abs(double(got[k][r][e]) - want[k][r][e]) / std::max(1.0, std::abs(want[k][r][e])));
      }
  return worst;
}

// Right after fragment f lands, every replica holds the same bits for it.
void require_landed_fragments_identical(const history_t& got, const schedule& c) {
  for (int s = 1; s <= static_cast<int>(got.size()); ++s)
    for (int f = 0; f < c.fragments; ++f) {
      const int started = s - c.delay;
      if (started < 1 || !c.starts(f, started)) continue;
      CAPTURE(s, f);
      const auto& replicas = got[static_cast<std::size_t>(s - 1)];
      for (const auto& w : replicas)
        REQUIRE(std::equal(w.begin() + static_cast<std::ptrdiff_t>(c.lo(f)),
                           w.begin() + static_cast<std::ptrdiff_t>(c.lo(f + 1)),
                           replicas[0].begin() + static_cast<std::ptrdiff_t>(c.lo(f))));
    }
}

bool all_equal(const std::vector<flat_t>& replicas) {
  return std::all_of(replicas.begin(), replicas.end(), [&](const flat_t& p) { return p == replicas[0]; });
}

using sgd_inner = gw::optim::sgd;
template <int H, class Outer>
using strategy_with = gw::strategy<gw::host_tensor<float>, sgd_inner, agg::averaging<H, Outer>, gw::transport::inproc>;
}  // namespace

TEST_CASE("DiLoCo with outer SGD at lr 1 and no momentum is local SGD (theta - (theta - mean) = mean)") {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  constexpr int period = 3, steps = 9;
  const auto data = make_data(steps, ranks);
  const sgd_inner inner({.lr = 0.1});
  const auto local = train<gw::local_sgd<gw::host_tensor<float>, sgd_inner, period>>(
      ranks, data, inner, [] { return agg::averaging<period>(); });
  const auto outer_sgd = train<strategy_with<period, gw::optim::sgd>>(
      ranks, data, inner, [] { return agg::averaging<period, gw::optim::sgd>(gw::optim::sgd({.lr = 1.0})); });
  const auto outer_momentum = train<strategy_with<period, gw::optim::momentum>>(ranks, data, inner, [] {
    return agg::averaging<period, gw::optim::momentum>(gw::optim::momentum({.lr = 1.0, .momentum = 0.0}));
  });
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k + 1);
    REQUIRE(all_equal(outer_sgd[k]) == ((k + 1) % period == 0));
    for (int r = 0; r < ranks; ++r)
      for (std::size_t e = 0; e < total; ++e) {
        REQUIRE(outer_sgd[k][r][e] == Approx(local[k][r][e]).epsilon(1e-5).margin(1e-6));
        REQUIRE(outer_momentum[k][r][e] == Approx(local[k][r][e]).epsilon(1e-5).margin(1e-6));
      }
  }
  REQUIRE(local.back()[0] != initial<float>(0));  // not vacuous: training moved the parameters
}

TEST_CASE("DiLoCo with outer Nesterov momentum equals a float64 serial DiLoCo, replicas bit-identical after each sync") {
  const int ranks = GENERATE(1, 2, 3, 4);
  CAPTURE(ranks);
  constexpr int period = 4, steps = 12;
  const auto data = make_data(steps, ranks);
  const auto history = train<gw::diloco<gw::host_tensor<float>, sgd_inner, period>>(
      ranks, data, sgd_inner({.lr = 0.1}), [] { return agg::diloco<period>(); });
  const schedule c{.period = period};
  const double worst = compare(history, reference(ranks, data, c));
  INFO("largest relative difference from float64: " << worst);
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k + 1);
    if ((k + 1) % period == 0)
      REQUIRE(all_equal(history[k]));
    else if (ranks > 1)
      REQUIRE_FALSE(all_equal(history[k]));  // each replica stepped on its own data
  }
  // The outer step is not the mean: Nesterov at lr 0.7 moves past it (not vacuous).
  const auto plain = train<gw::local_sgd<gw::host_tensor<float>, sgd_inner, period>>(
      ranks, data, sgd_inner({.lr = 0.1}), [] { return agg::averaging<period>(); });
  REQUIRE(history[period - 1][0] != plain[period - 1][0]);
}

// The pseudo-gradients through a codec (averaging::compress): the replicas still land on the
// same bits, the bytes on the wire shrink by the codec's ratio, and the trajectory stays within
// the codec's rounding of plain DiLoCo's (bf16 keeps 8 bits of mantissa, int8 7 of the largest
// value; a few re-encodings per sum, compounded over three outer steps).
TEMPLATE_TEST_CASE("DiLoCo with compressed pseudo-gradients: identical replicas, fewer bytes, close to plain DiLoCo",
                   "", gw::compress::bf16, gw::compress::int8) {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  constexpr int period = 4, steps = 12;
  const auto data = make_data(steps, ranks);
  const sgd_inner inner({.lr = 0.1});
  using plain_s = gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period>;
  using codec_s = gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period, gw::transport::inproc, TestType>;
  // Each run alone on its threads, its bytes sent per rank counted by the strategy.
  auto run = [&](auto make_strategy, std::vector<std::uint64_t>& bytes) {
    history_t history(steps, std::vector<flat_t>(static_cast<std::size_t>(ranks)));
    bytes.assign(static_cast<std::size_t>(ranks), 0);
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      const auto r = static_cast<std::size_t>(t.rank());
      auto s = make_strategy(t);
      for (std::size_t k = 0; k < steps; ++k) {
        auto p = s.parameters();
        s.step(model.gradients(p[0].data(), p[1].data(), data[k][r]));
        history[k][r] = snapshot(s);
      }
      bytes[r] = s.cumulative_stats().traffic.bytes_sent;
    });
    return history;
  };
  std::vector<std::uint64_t> plain_bytes, codec_bytes;
  const history_t plain =
      run([&](gw::transport::inproc t) { return plain_s(t, make_params(t.rank()), inner, agg::diloco(period)); },
          plain_bytes);
  const history_t compressed = run(
      [&](gw::transport::inproc t) { return codec_s(t, make_params(t.rank()), inner, agg::diloco(period, {}, TestType{})); },
      codec_bytes);
  double moved = 0, worst = 0;
  for (std::size_t e = 0; e < total; ++e) moved = std::max(moved, std::abs(double(plain.back()[0][e]) - initial<double>(0)[e]));
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k + 1);
    if ((k + 1) % period == 0) REQUIRE(all_equal(compressed[static_cast<std::size_t>(k)]));
    for (std::size_t e = 0; e < total; ++e)
      worst = std::max(worst, std::abs(double(compressed[static_cast<std::size_t>(k)][0][e]) -
                                       double(plain[static_cast<std::size_t>(k)][0][e])));
  }
  INFO("largest difference from plain DiLoCo " << worst << ", of a largest move of " << moved);
  REQUIRE(worst <= 0.02 * moved);
  REQUIRE(compressed.back()[0] != plain.back()[0]);  // it did go through the codec
  // bf16: 2 bytes an element, int8: 1 and a 4-byte scale per chunk, over the ring; plain
  // DiLoCo's all_reduce<auto_> sends a buffer this small whole to every rank (one-shot), so
  // the measured ratio is below the codec's own (0.26 and 0.17 here at 3 ranks).
  const double ratio = double(codec_bytes[0]) / double(plain_bytes[0]);
  INFO("bytes sent, compressed / plain: " << ratio);
  REQUIRE(codec_bytes[0] < plain_bytes[0]);
  REQUIRE(ratio < (std::is_same_v<TestType, gw::compress::bf16> ? 0.8 : 0.7));
}

TEST_CASE("DiLoCo's options: the paper's defaults, and a run-time period") {
  const auto d = agg::diloco<8>();
  REQUIRE(d.every() == 8);
  REQUIRE(d.outer_optimizer().settings().lr == 0.7);
  REQUIRE(d.outer_optimizer().settings().momentum == 0.9);
  REQUIRE(d.outer_optimizer().settings().nesterov);
  REQUIRE(d.fragments() == 1);
  REQUIRE(d.delay() == 0);
  const auto r = agg::diloco(6, {.outer_lr = 0.5, .outer_momentum = 0.8, .fragments = 3, .delay = 2});
  REQUIRE(r.every() == 6);
  REQUIRE(r.outer_optimizer().settings().lr == 0.5);
  REQUIRE(r.outer_optimizer().settings().momentum == 0.8);
  REQUIRE((r.fragments() == 3 && r.delay() == 2));
}

TEST_CASE("streaming DiLoCo with one fragment and no delay is non-streaming DiLoCo, bit for bit") {
  constexpr int ranks = 3, period = 3, steps = 9;
  const auto data = make_data(steps, ranks);
  const sgd_inner inner({.lr = 0.1});
  using S = gw::diloco<gw::host_tensor<float>, sgd_inner, period>;
  using D = gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period>;
  const auto plain = train<S>(ranks, data, inner, [] { return agg::diloco_averaging<period>(agg::diloco_outer_optimizer()); });
  const auto streamed = train<S>(ranks, data, inner, [] { return agg::diloco<period>({.fragments = 1, .delay = 0}); });
  const auto run_time =
      train<D>(ranks, data, inner, [] { return agg::diloco_averaging<>(period, agg::diloco_outer_optimizer()).stream(1, 0); });
  REQUIRE(streamed == plain);
  REQUIRE(run_time == plain);
}

TEST_CASE("streaming DiLoCo: fragments at staggered steps, updates landing after a delay, against float64") {
  struct setting {
    int ranks, period, fragments, delay;
  };
  // 24 elements in 3 fragments of 8 cut W (21 elements) twice; 5 fragments do not divide
  // them evenly; period 2 with 4 fragments syncs two fragments at each offset.
  const auto [ranks, period, fragments, delay] =
      GENERATE(setting{2, 6, 3, 0}, setting{3, 6, 3, 2}, setting{2, 4, 4, 1}, setting{3, 5, 5, 4}, setting{2, 2, 4, 1},
               setting{2, 6, 1, 3});
  CAPTURE(ranks, period, fragments, delay);
  constexpr int steps = 15;
  const auto data = make_data(steps, ranks);
  const auto history = train<gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period>>(
      ranks, data, sgd_inner({.lr = 0.1}),
      [&] { return agg::diloco(period, {.fragments = fragments, .delay = delay}); });
  const schedule c{.period = period, .fragments = fragments, .delay = delay};
  const double worst = compare(history, reference(ranks, data, c));
  INFO("largest relative difference from float64: " << worst);
  require_landed_fragments_identical(history, c);
  // Before anything lands the replicas differ (each steps on its own data): not vacuous.
  REQUIRE_FALSE(all_equal(history.front()));
}

// Training that ends with fragments pending (their all-reduce has run, their update would
// land after a later step): strategy::flush() lands them, as the float64 reference does after
// its last step, and the replicas then agree on those fragments. Without it they are lost,
// and a strategy destroyed with updates pending says so (a warning per rank).
TEST_CASE("streaming DiLoCo: flush() after the last step lands the pending updates as the float64 reference does") {
  struct setting {
    int ranks, period, fragments, delay, steps;
  };
  const auto [ranks, period, fragments, delay, steps] =
      GENERATE(setting{3, 4, 4, 2, 14}, setting{2, 6, 3, 3, 13}, setting{1, 4, 2, 3, 7});
  CAPTURE(ranks, period, fragments, delay, steps);
  const schedule c{.period = period, .fragments = fragments, .delay = delay};
  // The fragments whose all-reduce started in the last `delay` steps: still pending at the end.
  std::vector<int> pending;
  for (int f = 0; f < fragments; ++f)
    for (int s = std::max(1, steps - delay + 1); s <= steps; ++s)
      if (c.starts(f, s)) pending.push_back(f);
  REQUIRE_FALSE(pending.empty());  // not vacuous

  const auto data = make_data(steps, ranks);
  const auto n = static_cast<std::size_t>(ranks);
  history_t history(static_cast<std::size_t>(steps), std::vector<flat_t>(n)), flushed(1, std::vector<flat_t>(n));
  std::vector<std::size_t> before(n), after(n);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int rank = t.rank();
    const auto r = static_cast<std::size_t>(rank);
    gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period> s(
        t, make_params(rank), sgd_inner({.lr = 0.1}), agg::diloco(period, {.fragments = fragments, .delay = delay}));
    for (int k = 0; k < steps; ++k) {
      train_step(s, data, static_cast<std::size_t>(k), rank);
      history[static_cast<std::size_t>(k)][r] = snapshot(s);
    }
    before[r] = s.aggregation().pending_updates();
    s.flush();
    after[r] = s.aggregation().pending_updates();
    flushed[0][r] = snapshot(s);
  });
  REQUIRE(before == std::vector<std::size_t>(n, pending.size()));
  REQUIRE(after == std::vector<std::size_t>(n, 0));
  const reference_t want = reference(ranks, data, c, /*flush_at_end=*/true);
  REQUIRE(want.size() == static_cast<std::size_t>(steps) + 1);
  compare(history, want);
  INFO("largest relative difference from float64 after flush(): " << compare(flushed, {want.back()}));
  for (int f : pending) {
    CAPTURE(f);
    for (const auto& w : flushed[0])
      REQUIRE(std::equal(w.begin() + static_cast<std::ptrdiff_t>(c.lo(f)), w.begin() + static_cast<std::ptrdiff_t>(c.lo(f + 1)),
                         flushed[0][0].begin() + static_cast<std::ptrdiff_t>(c.lo(f))));
  }
  REQUIRE(flushed[0][0] != history.back()[0]);  // flush() changed the parameters: the updates were owed
}

TEST_CASE("a streaming DiLoCo strategy destroyed with updates pending warns once per rank, a flushed one does not") {
  constexpr int ranks = 2, period = 4, steps = 6;  // fragment 1 of 2 starts after step 6, would land after 7
  const auto data = make_data(steps, ranks);
  std::FILE* sink = std::tmpfile();
  REQUIRE(sink != nullptr);
  gw::observe::set_log_sink(sink);
  auto run = [&](bool flush) {
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
      gw::diloco<gw::host_tensor<float>, sgd_inner, period> s(t, make_params(t.rank()), sgd_inner({.lr = 0.1}),
                                                            agg::diloco<period>({.fragments = 2, .delay = 1}));
      for (int k = 0; k < steps; ++k) train_step(s, data, static_cast<std::size_t>(k), t.rank());
      if (flush) s.flush();
    });
  };
  auto warnings = [&] {
    std::fflush(sink);
    std::rewind(sink);
    std::string text;
    for (int ch; (ch = std::fgetc(sink)) != EOF;) text += static_cast<char>(ch);
    std::size_t count = 0;
    for (std::size_t at = 0; (at = text.find("call strategy.flush() after the last step", at)) != std::string::npos; ++at)
      ++count;
    return std::pair{count, text};
  };
  run(true);
  const auto [quiet, quiet_text] = warnings();
  run(false);
  const auto [loud, loud_text] = warnings();
  gw::observe::set_log_sink(nullptr);
  std::fclose(sink);
  INFO(loud_text);
  REQUIRE(quiet == 0);
  REQUIRE(loud == std::size_t{ranks});
  REQUIRE_THAT(loud_text, Catch::Contains("the strategy ended with 1 fragment's outer update pending"));
}

TEST_CASE("DiLoCo with its all-reduces cut into calls of bucket_bytes equals the float64 reference") {
  // bucket_bytes of 5 floats: the 24 elements (or a fragment of them) take several all-reduce
  // calls, the last one shorter; every call must average its own part.
  struct setting {
    int ranks, period, fragments, delay;
  };
  const auto [ranks, period, fragments, delay] =
      GENERATE(setting{3, 4, 1, 0}, setting{2, 4, 2, 1}, setting{3, 6, 3, 2});
  CAPTURE(ranks, period, fragments, delay);
  constexpr int steps = 13;
  const auto data = make_data(steps, ranks);
  const auto history = train<gw::diloco<gw::host_tensor<float>, sgd_inner, agg::dynamic_period>>(
      ranks, data, sgd_inner({.lr = 0.1}), [&] {
        return agg::diloco(period, {.fragments = fragments, .delay = delay, .bucket_bytes = 5 * sizeof(float)});
      });
  const schedule c{.period = period, .fragments = fragments, .delay = delay};
  const double worst = compare(history, reference(ranks, data, c));
  INFO("largest relative difference from float64: " << worst);
  require_landed_fragments_identical(history, c);
}

TEST_CASE("DiLoCo refuses bad options with invalid_argument and says what to do") {
  auto refused = [](auto make, const std::string& words) {
    try {
      make();
      FAIL("accepted");
    } catch (const gw::error& e) {
      REQUIRE(e.kind() == gw::errc::invalid_argument);
      REQUIRE_THAT(e.what(), Catch::Contains(words));
    }
  };
  SECTION("a period below 1") {
    refused([] { return agg::diloco(0); }, "period must be >= 1");
    refused([] { return agg::averaging<agg::dynamic_period, gw::optim::sgd>(-2, gw::optim::sgd()); }, "got -2");
  }
  SECTION("fewer than one fragment") {
    refused([] { return agg::diloco<4>({.fragments = 0}); }, "fragment count must be >= 1");
  }
  SECTION("a delay outside [0, period)") {
    refused([] { return agg::diloco<4>({.fragments = 2, .delay = 4}); }, "delay must be in [0, period) = [0, 4)");
    refused([] { return agg::diloco(3, {.delay = -1}); }, "lower the delay");
  }
  SECTION("more fragments than parameter elements: at setup, on every rank") {
    for (int n : {2, 1}) {
      CAPTURE(n);
      REQUIRE_THROWS_WITH(gw::transport::run_inproc(n,
                                                    [&](gw::transport::inproc t) {
                                                      gw::diloco<gw::host_tensor<float>, sgd_inner, 4> s(
                                                          t, make_params(t.rank()), sgd_inner(),
                                                          agg::diloco<4>({.fragments = int(total) + 1}));
                                                    }),
                          Catch::Contains("only 24 parameter elements; use at most that many fragments"));
    }
  }
  SECTION("average_optimizer_state() with streaming") {
    refused(
        [] {
          using A = agg::averaging<4, gw::optim::momentum>;
          return A::agent<float, gw::transport::inproc>(
              A(agg::diloco_outer_optimizer()).stream(2).average_optimizer_state());
        },
        "does not combine with stream()");
  }
}

TEST_CASE("DiLoCo keeps the inner optimizer's state per replica, average_optimizer_state() still averages it at F = 1") {
  constexpr int ranks = 2, period = 2, steps = 4;
  const auto data = make_data(steps, ranks);
  using S = gw::diloco<gw::host_tensor<float>, gw::optim::momentum, period>;
  std::vector<std::vector<float>> velocity(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    S s(t, make_params(t.rank()), gw::optim::momentum({.lr = 0.05}), agg::diloco<period>().average_optimizer_state());
    for (int k = 0; k < steps; ++k) {
      auto p = s.parameters();
      s.step(model.gradients(p[0].data(), p[1].data(), data[k][t.rank()]));
    }
    for (auto& st : s.optimizer_states())
      st.for_each_buffer([&](std::span<const float> b) { velocity[t.rank()].insert(velocity[t.rank()].end(), b.begin(), b.end()); });
    REQUIRE(std::equal(s.aggregation().anchor().begin(), s.aggregation().anchor().end(), snapshot(s).begin()));
  });
  REQUIRE(velocity[0] == velocity[1]);
}

#if GRADWIRE_HAS_ASIO
TEST_CASE("streaming DiLoCo over asio_tcp ranks (threads of this process) equals the float64 reference") {
  constexpr int ranks = 3, period = 4, fragments = 2, delay = 1, steps = 10;
  const auto data = make_data(steps, ranks);
  using S = gw::diloco<gw::host_tensor<float>, sgd_inner, period, gw::transport::asio_tcp>;
  history_t history(steps, std::vector<flat_t>(ranks));
  gw::testing::run_tcp_threads(ranks, "test-diloco", [&](gw::transport::asio_tcp t) {
    replica<S>(std::move(t), data, sgd_inner({.lr = 0.1}),
               [] { return agg::diloco<period>({.fragments = fragments, .delay = delay}); }, history);
  });
  const schedule c{.period = period, .fragments = fragments, .delay = delay};
  compare(history, reference(ranks, data, c));
  require_landed_fragments_identical(history, c);
}
#endif
