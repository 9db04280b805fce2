// The analytic cost models (plan/cost_model.hpp) against the simulator: the library's real collectives and all-reduce strategy on transport::simulated.
//
// compute=modelled, so a virtual time is the network model's and simulation::compute's
// alone, exactly reproducible: a deviation is the cost model's, not noise, and each
// tolerance is what the model is built to (docs/planning.md, "How close to the simulator"):
//   ring, and halving-doubling on powers of two: 0.1%. Both are priced message by message
//     as the simulator carries them (the ring as a recursion over its neighbours,
//     halving-doubling round by round with its R messages on a host link); what is left
//     is the simulator's rounding of each transfer to whole nanoseconds (measured here:
//     under 0.01%).
//   hierarchical: 8%. Its rounds inside a host are priced in lockstep and its rings across
//     hosts as one shared link, where the simulator lets ranks run ahead; measured on 2 to 4
//     hosts of 2 to 4 ranks, 64 KiB to 16 MiB, at these links: -7.7% (2 x 2, 64 KiB, where
//     overhead and latency chains dominate) to +6.0% (from 4 MiB, where segments pipeline);
//     in this test -3.1% to +6.0%. Without a hierarchy it is the ring, exactly.
//   one-shot: 0.1%, or one message's overhead (4 x 2 ranks from 1 Ki floats, where the
//     model is 1 us under the simulator: -1.05% at 1 Ki floats; exact elsewhere).
//   a synchronous all-reduce step: 3%. Compute plus the bucketed all-reduce, one after the
//     other, as the strategy runs them without stragglers: the all-reduce's own deviation
//     times its share of the step (measured: 0.3% on 2 x 4, exact on one host or one rank
//     per host).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradwire/aggregation/all_reduce.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/reduce.hpp>
#include <gradwire/observe/log.hpp>
#include <gradwire/optim/sgd.hpp>
#include <gradwire/plan/cost_model.hpp>
#include <gradwire/strategy.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#include <gradwire/transport/simulated.hpp>

namespace gw = gradwire;
namespace plan = gradwire::plan;
namespace sim = gradwire::simulation;
using plan::all_reduce_algorithm;

namespace {

double seconds(sim::duration d) { return double(d.count()) * 1e-9; }

// Fast links, 1 us of CPU per message: latency and overhead chains count as much as bytes.
sim::cluster_model layout(int hosts, int ranks_per_host) {
  return sim::parse_cluster_model("hosts=" + std::to_string(hosts) + " ranks_per_host=" + std::to_string(ranks_per_host) +
                                  " bandwidth=10Gbit latency=20us local_bandwidth=10GB local_latency=2us overhead=1us "
                                  "compute=modelled");
}

using simulated_communicator = gw::collective::communicator<gw::transport::simulated>;

// The virtual time of one sum of `elements` floats on every rank of `c` by reduce(comm,
// data), from time 0 (constructing the communicator sends nothing), with the call check
// on as the communicator's defaults have it, and the cost model's defaults to match.
template <class Reduce>
double simulated_all_reduce(const sim::cluster_model& c, std::size_t elements, Reduce reduce) {
  float first = 0;
  const sim::run_report report = sim::run(c, [&](gw::transport::simulated t) {
    simulated_communicator comm(std::move(t));
    std::vector<float> x(elements, float(comm.rank() + 1));
    reduce(comm, std::span<float>(x));
    if (comm.rank() == 0) first = x.front();
  });
  REQUIRE(first == float(c.size() * (c.size() + 1) / 2));  // it did reduce
  return seconds(report.end);
}

template <class Algorithm>
double simulated_all_reduce(const sim::cluster_model& c, std::size_t elements) {
  return simulated_all_reduce(c, elements, [](simulated_communicator& comm, std::span<float> x) {
    gw::collective::all_reduce<Algorithm>(comm, x);
  });
}

template <class Algorithm>
void check_all_reduce(const sim::cluster_model& c, all_reduce_algorithm a, std::size_t elements, double tolerance) {
  const plan::all_reduce_cost predicted = plan::predict_all_reduce(c, a, elements);
  REQUIRE(predicted.available);
  const double simulated = simulated_all_reduce<Algorithm>(c, elements);
  CAPTURE(sim::describe(c), plan::name_of(a), elements, predicted.seconds, simulated);
  CHECK(predicted.seconds == Approx(simulated).epsilon(tolerance));
}

}  // namespace

TEST_CASE("all-reduce predictions against the simulator: ring, hierarchical and halving-doubling") {
  namespace col = gw::collective;
  // One host, one rank per host, and two hierarchies; 8 ranks at most: powers of two.
  for (const auto& [hosts, per_host] : {std::pair{1, 4}, std::pair{4, 1}, std::pair{2, 4}, std::pair{4, 2}}) {
    const auto c = layout(hosts, per_host);
    // 64 KiB (hierarchical in one segment) and 4 MiB (in 8, pipelined).
    for (const std::size_t elements : {std::size_t{16} << 10, std::size_t{1} << 20}) {
      check_all_reduce<col::ring>(c, all_reduce_algorithm::ring, elements, 0.001);
      check_all_reduce<col::halving_doubling>(c, all_reduce_algorithm::halving_doubling, elements, 0.001);
      check_all_reduce<col::hierarchical>(c, all_reduce_algorithm::hierarchical, elements,
                                          plan::has_hierarchy(c) ? 0.08 : 0.001);
    }
  }
}

TEST_CASE("one-shot predictions against the simulator, the call check's descriptor to every far peer included") {
  for (const auto& [hosts, per_host] : {std::pair{1, 4}, std::pair{4, 1}, std::pair{2, 4}, std::pair{4, 2}}) {
    const auto c = layout(hosts, per_host);
    // 16 floats ride inside the ring neighbours' check frames; 1 Ki and 16 Ki floats do not.
    for (const std::size_t elements : {std::size_t{16}, std::size_t{1} << 10, std::size_t{16} << 10}) {
      const double predicted = plan::predict_all_reduce(c, all_reduce_algorithm::one_shot, elements).seconds;
      const double simulated = simulated_all_reduce(c, elements, [](simulated_communicator& comm, std::span<float> x) {
        gw::collective::one_shot_all_reduce(comm, x);
      });
      CAPTURE(sim::describe(c), elements, predicted, simulated);
      // Within 0.1%, or one message's overhead: on 4 x 2 ranks, from 1 Ki floats, the model
      // is one overhead (1 us) under (-1.05% at 1 Ki floats); exact elsewhere. Pricing the
      // descriptors to only some far peers misses by up to 4 us (12%).
      CHECK(predicted == Approx(simulated).epsilon(0.001).margin(1.01e-6));
    }
  }
}

TEST_CASE("a synchronous all-reduce step against the simulator: the slowest compute plus the bucketed all-reduce") {
  // Fashion-MNIST's MLP (one bucket), 2 ms of modelled compute per step, no stragglers:
  // the strategy's step is compute + all_reduce<auto_> of the gradient, one after the other.
  const std::vector<std::size_t> tensors{784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
  const double compute = 2e-3;
  const int warmup = 2, steps = 10;
  for (const auto& [hosts, per_host] : {std::pair{1, 4}, std::pair{4, 1}, std::pair{2, 4}}) {
    const auto c = layout(hosts, per_host);
    sim::duration measured{};
    sim::run(c, [&](gw::transport::simulated t) {
      std::vector<gw::host_tensor<float>> params;
      std::vector<std::vector<float>> grads;
      for (auto n : tensors) {
        std::fill_n(params.emplace_back(gw::shape{n}).data(), n, 0.5f);
        grads.emplace_back(n, 0.25f);
      }
      gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, gw::transport::simulated> s(
          std::move(t), params, gw::optim::sgd({.lr = 0.01}));
      sim::time_point start{};
      for (int k = 0; k < warmup + steps; ++k) {
        if (k == warmup) start = sim::now();
        sim::compute(std::chrono::nanoseconds(std::llround(compute * 1e9)));
        s.step(grads);
      }
      if (s.rank() == 0) measured = (sim::now() - start) / steps;
    });
    std::size_t p = 0;
    for (auto n : tensors) p += n;
    const plan::strategy_costs costs(c, {p, tensors, 64, compute, {}});
    const plan::strategy_cost predicted = costs.all_reduce(all_reduce_algorithm::auto_);
    CAPTURE(sim::describe(c), predicted.step, seconds(measured));
    CHECK(predicted.step == Approx(seconds(measured)).epsilon(0.03));
  }
}

namespace {

// Logs at debug into a temporary file for the scope (every collective logs a line naming
// the algorithm it ran: observe::trace_scope); back to off and stderr after.
struct debug_log_capture {
  std::FILE* file = std::tmpfile();
  debug_log_capture() {
    REQUIRE(file);
    gw::observe::set_log_sink(file);
    gw::observe::set_log_level(gw::observe::log_level::debug);
  }
  ~debug_log_capture() {
    gw::observe::set_log_level(gw::observe::log_level::off);
    gw::observe::set_log_sink(nullptr);
    std::fclose(file);
  }
  std::vector<std::string> lines() {
    std::fflush(file);
    std::rewind(file);
    std::vector<std::string> out;
    std::string line;
    for (int ch; (ch = std::fgetc(file)) != EOF;)
      if (ch == '\n') out.push_back(std::exchange(line, {}));
      else line += char(ch);
    return out;
  }
};

}  // namespace

TEST_CASE("the planner's auto_ takes the algorithm all_reduce<auto_> runs, at every size and on every topology") {
  // What all_reduce<auto_> runs is read from its own log line (algorithm=...), on rank 0 of
  // a simulated cluster of that shape; the planner must name the same for every size: powers
  // of two from 1 element to 4 MiB, and one below, at and above each threshold of the
  // communicator's options (the check frame's 64 B, one-shot's copies on N ranks, the
  // hierarchical and the halving-doubling limits), on one host, one rank per host and
  // hierarchies, powers of two and not, up to and past one-shot's 8 ranks.
  const gw::collective::communicator_options defaults;
  const std::size_t word = sizeof(float);
  for (const auto& [hosts, per_host] :
       {std::pair{1, 1}, std::pair{1, 2}, std::pair{1, 3}, std::pair{1, 4}, std::pair{1, 5}, std::pair{1, 7},
        std::pair{1, 8}, std::pair{1, 9}, std::pair{2, 1}, std::pair{3, 1}, std::pair{8, 1}, std::pair{9, 1},
        std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}, std::pair{2, 4}, std::pair{4, 2}, std::pair{3, 3}}) {
    const auto c = layout(hosts, per_host);
    const int n = c.size();
    std::vector<std::size_t> sizes{0};
    for (std::size_t e = 1; e <= (std::size_t{1} << 20); e *= 2) sizes.push_back(e);
    std::vector<std::size_t> edges{gw::collective::check_inline_bytes / word, defaults.hierarchical_min_bytes / word,
                                   defaults.small_all_reduce_bytes / word};
    if (n >= 2) edges.push_back(defaults.one_shot_max_sent_bytes / std::size_t(n - 1) / word);
    for (const std::size_t e : edges)
      for (const std::size_t s : {e - 1, e, e + 1}) sizes.push_back(s);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

    debug_log_capture log;
    sim::run(c, [&](gw::transport::simulated t) {
      gw::collective::communicator<gw::transport::simulated> comm(std::move(t));
      for (const std::size_t elements : sizes) {
        std::vector<float> x(elements, 1.0f);
        gw::collective::all_reduce(comm, std::span<float>(x));
      }
    });
    // Rank 0's lines "[gradwire 0/N ...] debug: all_reduce: BYTES B in T us algorithm=NAME", in call order.
    const std::string mine = "[gradwire 0/" + std::to_string(n) + " ", what = "] debug: all_reduce: ",
                      key = " algorithm=";
    std::vector<std::pair<std::size_t, std::string>> ran;  // bytes, algorithm
    for (const auto& line : log.lines()) {
      const auto at = line.find(what), named = line.find(key);
      if (line.rfind(mine, 0) != 0 || at == std::string::npos || named == std::string::npos) continue;
      ran.emplace_back(std::stoull(line.substr(at + what.size())), line.substr(named + key.size()));
    }
    CAPTURE(sim::describe(c));
    REQUIRE(ran.size() == sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t elements = sizes[i];
      const plan::all_reduce_cost planned = plan::predict_all_reduce(c, all_reduce_algorithm::auto_, elements);
      CAPTURE(elements, ran[i].first);
      REQUIRE(ran[i].first == elements * word);
      CHECK(plan::name_of(plan::auto_choice(c, elements)) == ran[i].second);
      CHECK(plan::name_of(planned.runs) == ran[i].second);
    }
  }
}

TEST_CASE("the planner's reduce takes the algorithm reduce runs, on both sides of small_all_reduce_bytes") {
  // As for all-reduce above: reduce's log line (algorithm=tree or scatter_gather) on rank 0
  // of a simulated cluster, against what the planner prices, for floats and doubles (the
  // limit is in bytes) one below, at and above the limit, on 2 ranks (always the tree) and on
  // more, on one host and across hosts.
  const std::size_t limit = gw::collective::communicator_options{}.small_all_reduce_bytes;
  for (const auto& [hosts, per_host] : {std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 2}, std::pair{4, 1}}) {
    const auto c = layout(hosts, per_host);
    const int n = c.size();
    debug_log_capture log;
    std::vector<std::pair<std::size_t, std::size_t>> calls;  // elements, bytes per element
    sim::run(c, [&](gw::transport::simulated t) {
      simulated_communicator comm(std::move(t));
      auto reduce_each = [&](auto element) {
        using V = decltype(element);
        for (const std::size_t elements : {std::size_t{1}, limit / sizeof(V) - 1, limit / sizeof(V), limit / sizeof(V) + 1}) {
          std::vector<V> x(elements, V(1));
          gw::collective::reduce(comm, std::span<V>(x), 0);
          if (comm.rank() == 0) calls.emplace_back(elements, sizeof(V));
        }
      };
      reduce_each(float{});
      reduce_each(double{});
    });
    // Rank 0's lines "[gradwire 0/N ...] debug: reduce: BYTES B in T us algorithm=NAME root=0", in call order.
    const std::string mine = "[gradwire 0/" + std::to_string(n) + " ", what = "] debug: reduce: ", key = " algorithm=";
    std::vector<std::string> ran;
    for (const auto& line : log.lines()) {
      const auto at = line.find(what), named = line.find(key);
      if (line.rfind(mine, 0) != 0 || at == std::string::npos || named == std::string::npos) continue;
      const std::string rest = line.substr(named + key.size());
      ran.push_back(rest.substr(0, rest.find(' ')));
    }
    CAPTURE(sim::describe(c));
    REQUIRE(ran.size() == calls.size());
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const auto [elements, element_bytes] = calls[i];
      CAPTURE(elements, element_bytes);
      const bool tree = plan::reduce_takes_tree(c, elements, {.element_bytes = element_bytes});
      CHECK((tree ? "tree" : "scatter_gather") == ran[i]);
    }
  }
}

TEST_CASE("ring all-reduce predictions against the simulator where a rank's send to the next host is its slowest link") {
  // 2 and 3 hosts of 2 and 3 ranks, a network ten times slower than memory, 50 us of CPU per
  // message: the last rank of a host finishes a step when its own send has crossed the
  // network, after the overheads of the messages posted before it.
  for (const auto& [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 3}}) {
    const auto c = sim::parse_cluster_model("hosts=" + std::to_string(hosts) + " ranks_per_host=" + std::to_string(per_host) +
                                            " bandwidth=8Gbit latency=20us local_bandwidth=10GB local_latency=2us "
                                            "overhead=50us compute=modelled");
    for (const std::size_t elements : {std::size_t{1} << 16, std::size_t{1} << 20}) {
      const plan::all_reduce_cost predicted = plan::predict_all_reduce(c, all_reduce_algorithm::ring, elements);
      const double simulated = simulated_all_reduce<gw::collective::ring>(c, elements);
      CAPTURE(hosts, per_host, elements, predicted.seconds, simulated);
      CHECK(predicted.seconds == Approx(simulated).epsilon(1e-4));  // measured: within 4e-6
    }
  }
}

TEST_CASE("reduce predictions against the simulator: the tree and scatter-gather onto rank 0, scatter-gather onto the last") {
  // What central storage pays per bucket (its owner is rank 0). 1 Ki and 16 Ki floats go by
  // the tree (below small_all_reduce_bytes), 1 Mi by scatter-gather: N - 1 ring steps, then
  // the gather. Measured, within 0.02% everywhere here (pricing the ring steps apart from
  // the schedule was 0.5% over on 2 x 4). Not checked: the tree onto another root, which the
  // model prices 4% to 9% under the simulator on 2 hosts of 4 (root 7; docs/planning.md).
  for (const auto& [hosts, per_host] : {std::pair{1, 3}, std::pair{1, 4}, std::pair{4, 1}, std::pair{2, 4}, std::pair{4, 2}}) {
    const auto c = layout(hosts, per_host);
    for (const auto& [root, elements] : {std::pair{0, std::size_t{1} << 10}, std::pair{0, std::size_t{16} << 10},
                                         std::pair{0, std::size_t{1} << 20}, std::pair{c.size() - 1, std::size_t{1} << 20}}) {
      {
        const double predicted = plan::reduce_seconds(c, elements, root);
        float at_root = 0;
        const sim::run_report report = sim::run(c, [&, root](gw::transport::simulated t) {
          simulated_communicator comm(std::move(t));
          std::vector<float> x(elements, float(comm.rank() + 1));
          gw::collective::reduce(comm, std::span<float>(x), root);
          if (comm.rank() == root) at_root = x.back();
        });
        REQUIRE(at_root == float(c.size() * (c.size() + 1) / 2));  // it did reduce, onto the root
        const double simulated = seconds(report.end);
        CAPTURE(sim::describe(c), root, elements, predicted, simulated);
        CHECK(predicted == Approx(simulated).epsilon(0.001));
      }
    }
  }
}
