// The planner's command line: what model, workers, cluster and strategies to price (parse_plan_options).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <gradwire/error.hpp>
#include <gradwire/plan/cluster_model.hpp>
#include <gradwire/plan/cost_model.hpp>
#include <gradwire/tensor/shape.hpp>

namespace planner {

inline constexpr const char* usage_text =
    "usage: plan [options]\n"
    "Predicts step time and samples/s of every strategy and all-reduce algorithm on a described cluster\n"
    "(analytic cost models, gradwire/plan/cost_model.hpp; docs/planning.md) and says which to choose.\n"
    "  --params P                 float32 parameters of the model (default: the Fashion-MNIST MLP,\n"
    "                             784-256-128-10: 235146 in 6 tensors)\n"
    "  --tensors N,N,...          the model's tensor sizes (their sum is P): exact PS shards and buckets;\n"
    "                             without it, a --params model is priced as many small tensors; shapes\n"
    "                             (784x256,256,...: row-major) let PowerSGD read each weight as a matrix\n"
    "  --step-compute TIME        compute per step per worker at speed 1, measured: 2ms, 350us, 0.01s\n"
    "  --flops-per-sample X       ... or modelled: X flop per sample (default 6 x P: forward and backward)\n"
    "  --device-flops RATE        ... on a device of RATE flop/s: 50G, 2.5T (default 50G)\n"
    "  --batch B                  samples per worker per step (default 64)\n"
    "  --workers W                workers: every rank of the cluster (default: hosts x ranks_per_host; without\n"
    "                             --cluster, W hosts of one rank)\n"
    "  --cluster \"KEY=VALUE ...\"  the cluster (gradwire/plan/cluster_model.hpp): hosts=25 ranks_per_host=4\n"
    "                             bandwidth=10Gbit latency=20us jitter=0.1 tail=0.02:1.5 ...\n"
    "                             (default: hosts=4 ranks_per_host=2 bandwidth=1Gbit latency=50us)\n"
    "  --cluster-file F           ... or read from F (the same keys, one or more a line, # comments)\n"
    "  --servers S                parameter servers, on S extra ranks after the workers (default W / 10, >= 1)\n"
    "  --backup-workers K         backup_workers<K>: a sync step closes after W - K gradients (default W / 20, >= 1)\n"
    "  --staleness S              bounded_staleness<S> (default 2)\n"
    "  --period H                 local SGD: average the parameters every H steps (default 8)\n"
    "  --fragments F              DiLoCo (period H): also streamed in F fragments, each hidden behind\n"
    "                             --delay D inner steps (default F 4, D 1)\n"
    "  --delay D\n"
    "  --compress LIST            codecs to price all-reduce with, comma separated (default\n"
    "                             fp16,int8,topk:0.01,powersgd:4; none: leave them out)\n"
    "  --trials N                 Monte Carlo steps per straggler statistic (default 2000)\n"
    "  --simulate                 also train Fashion-MNIST with each strategy in the simulator (virtual time,\n"
    "                             one fashion_mnist process each) and compare their time to accuracy\n"
    "  with --simulate (the defaults are benchmarks/simulate_strategies.py's):\n"
    "  --fashion-mnist PATH       the example's binary (default: fashion_mnist beside this plan binary)\n"
    "  --epochs E                 passes over the training set (default 8)\n"
    "  --target-accuracy A        the test accuracy to time, in (0, 1] (default 0.88)\n"
    "  --lr LR                    Adam's rate for all-reduce, sync and backup workers (default 0.002)\n"
    "  --async-lr LR              ... for async and bounded staleness (default 1e-4)\n"
    "  --local-lr LR              ... for local SGD (default 0.002)\n"
    "  --help                     this text\n";

// Fashion-MNIST's MLP (examples/fashion_mnist/mlp.hpp): weights and biases of 784-256-128-10,
// their sizes and their shapes (row-major, as mlp::parameter_views names them).
inline const std::vector<std::size_t> fashion_mnist_tensors = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
inline const std::vector<gradwire::shape> fashion_mnist_shapes = {
    gradwire::shape{784, 256}, gradwire::shape{256}, gradwire::shape{256, 128},
    gradwire::shape{128},      gradwire::shape{128, 10}, gradwire::shape{10}};

// --simulate: how each strategy's Fashion-MNIST run is set up (simulate.hpp). The
// defaults are benchmarks/simulate_strategies.py's; keep the two alike.
struct simulate_options {
  std::string fashion_mnist;  // the example's binary; empty: beside plan's own
  int epochs = 8;
  double target_accuracy = 0.88;
  double lr = 0.002;        // Adam, synchronous strategies: the mean gradient of the global batch
  double async_lr = 1e-4;   // async and bounded staleness: every worker's gradient applied on its own
  double local_lr = 0.002;  // local SGD: each replica's own steps
};

struct plan_options {
  gradwire::plan::cluster_model cluster;
  gradwire::plan::workload work;
  std::string cluster_text;  // as given (or the default), for the report
  std::string compute_source;  // how work.step_seconds was found, for the report
  int servers = 1;
  int backup_workers = 1;
  int staleness = 2;
  int period = 8;
  int fragments = 4, delay = 1;                          // DiLoCo streaming
  std::vector<gradwire::plan::codec_model> codecs;      // compressed all-reduce (--compress)
  int trials = gradwire::plan::default_monte_carlo_trials;
  bool simulate = false;
  simulate_options run;  // with simulate
  bool help = false;
};

namespace detail {

[[noreturn]] inline void usage(const std::string& what) {
  throw gradwire::error(gradwire::errc::invalid_argument, what + " (plan --help lists the options)");
}

inline double number(std::string_view flag, std::string_view text, std::string_view& unit) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end == text.data() || !std::isfinite(v))
    usage(std::string(flag) + " expects a number, got '" + std::string(text) + "'");
  unit = text.substr(static_cast<std::size_t>(end - text.data()));
  return v;
}

inline long long integer(std::string_view flag, std::string_view text, long long min) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min)
    usage(std::string(flag) + " expects an integer >= " + std::to_string(min) + ", got '" + std::string(text) + "'");
  return v;
}

// A number > 0 followed by one of `units` (each a suffix and its scale), scaled;
// `expected` says what the flag takes, for the message.
inline double scaled(std::string_view flag, std::string_view text,
                     std::initializer_list<std::pair<std::string_view, double>> units, std::string_view expected) {
  std::string_view unit;
  const double v = number(flag, text, unit);
  const auto at = std::find_if(units.begin(), units.end(), [&](const auto& u) { return u.first == unit; });
  if (at == units.end() || !(v > 0))
    usage(std::string(flag) + " expects " + std::string(expected) + ", got '" + std::string(text) + "'");
  return v * at->second;
}

// "2ms", "350us", "0.01s", "0.01" (seconds).
inline double seconds(std::string_view flag, std::string_view text) {
  return scaled(flag, text, {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"", 1}},
                "a time > 0 such as 2ms, 350us or 0.01s");
}

// "50G", "2.5T", "1e9": a positive count with an optional K, M, G or T.
inline double count(std::string_view flag, std::string_view text) {
  return scaled(flag, text, {{"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}},
                "a number > 0 with an optional K, M, G or T");
}

// A number > 0 without a unit (a learning rate, an accuracy).
inline double positive(std::string_view flag, std::string_view text) {
  return scaled(flag, text, {{"", 1}}, "a number > 0");
}

// "200704,256,32768" (sizes) or "784x256,256,256x128" (shapes, row-major extents joined by x).
inline std::vector<gradwire::shape> tensor_shapes(std::string_view flag, std::string_view text) {
  std::vector<gradwire::shape> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    std::vector<std::size_t> extents;
    while (true) {
      const auto x = item.find('x');
      extents.push_back(static_cast<std::size_t>(integer(flag, item.substr(0, x), 0)));
      if (x == std::string_view::npos) break;
      item.remove_prefix(x + 1);
    }
    if (extents.size() > gradwire::shape::max_rank)
      usage(std::string(flag) + ": a tensor of more than " + std::to_string(gradwire::shape::max_rank) + " extents");
    out.emplace_back(extents);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  if (out.empty()) usage(std::string(flag) + " expects tensor sizes such as 200704,256 or shapes such as 784x256,256");
  return out;
}

// The command line one option at a time, each "--flag value" or "--flag=value".
class arguments {
 public:
  arguments(int argc, const char* const* argv) : argc_(argc), argv_(argv) {}

  // Moves to the next option; false after the last.
  bool next() {
    if (++at_ >= argc_) return false;
    flag_ = argv_[at_];
    attached_.reset();
    if (const auto eq = flag_.find('='); flag_.starts_with("--") && eq != std::string_view::npos) {
      attached_ = flag_.substr(eq + 1);
      flag_ = flag_.substr(0, eq);
    }
    return true;
  }
  std::string_view flag() const noexcept { return flag_; }
  // The option as typed, for messages.
  std::string typed() const { return argv_[at_]; }
  // Its value: after the '=', or the next argument.
  std::string_view value() {
    if (attached_) return *attached_;
    if (at_ + 1 >= argc_) usage(std::string(flag_) + " needs a value");
    return argv_[++at_];
  }
  // A switch: "--switch=value" is refused.
  void no_value() const {
    if (attached_) usage(std::string(flag_) + " takes no value");
  }

 private:
  int argc_;
  const char* const* argv_;
  int at_ = 0;
  std::string_view flag_;
  std::optional<std::string_view> attached_;
};

}  // namespace detail

// Reads the planner's options; throws gradwire::error(errc::invalid_argument) for a usage
// error and errc::config for a cluster description that does not parse, each saying what
// to change. --help sets `help` and nothing is checked.
inline plan_options parse_plan_options(int argc, const char* const* argv) {
  using namespace std::string_literals;
  plan_options o;
  std::optional<long long> params, workers, servers, backups;
  std::optional<std::vector<gradwire::shape>> tensors;
  std::optional<double> step, flops_per_sample;
  double device_flops = 50e9;
  std::optional<std::string> cluster_text, cluster_file;
  std::string compress = "fp16,int8,topk:0.01,powersgd:4";
  bool simulate_only = false;  // an option that only --simulate reads was given
  for (detail::arguments a(argc, argv); a.next();) {
    const std::string_view flag = a.flag();
    auto for_simulate = [&] {
      simulate_only = true;
      return a.value();
    };
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    } else if (flag == "--params") {
      params = detail::integer(flag, a.value(), 1);
    } else if (flag == "--tensors") {
      tensors = detail::tensor_shapes(flag, a.value());
    } else if (flag == "--step-compute") {
      step = detail::seconds(flag, a.value());
    } else if (flag == "--flops-per-sample") {
      flops_per_sample = detail::count(flag, a.value());
    } else if (flag == "--device-flops") {
      device_flops = detail::count(flag, a.value());
    } else if (flag == "--batch") {
      o.work.batch = static_cast<int>(detail::integer(flag, a.value(), 1));
    } else if (flag == "--workers") {
      workers = detail::integer(flag, a.value(), 1);
    } else if (flag == "--cluster") {
      cluster_text = std::string(a.value());
    } else if (flag == "--cluster-file") {
      cluster_file = std::string(a.value());
    } else if (flag == "--servers") {
      servers = detail::integer(flag, a.value(), 1);
    } else if (flag == "--backup-workers") {
      backups = detail::integer(flag, a.value(), 1);
    } else if (flag == "--staleness") {
      o.staleness = static_cast<int>(detail::integer(flag, a.value(), 0));
    } else if (flag == "--period") {
      o.period = static_cast<int>(detail::integer(flag, a.value(), 1));
    } else if (flag == "--fragments") {
      o.fragments = static_cast<int>(detail::integer(flag, a.value(), 1));
    } else if (flag == "--delay") {
      o.delay = static_cast<int>(detail::integer(flag, a.value(), 0));
    } else if (flag == "--compress") {
      compress = std::string(a.value());
    } else if (flag == "--trials") {
      o.trials = static_cast<int>(detail::integer(flag, a.value(), 1));
    } else if (flag == "--simulate") {
      a.no_value();
      o.simulate = true;
    } else if (flag == "--fashion-mnist") {
      o.run.fashion_mnist = std::string(for_simulate());
    } else if (flag == "--epochs") {
      o.run.epochs = static_cast<int>(detail::integer(flag, for_simulate(), 1));
    } else if (flag == "--target-accuracy") {
      o.run.target_accuracy = detail::positive(flag, for_simulate());
      if (o.run.target_accuracy > 1) detail::usage("--target-accuracy is a fraction in (0, 1], e.g. 0.88");
    } else if (flag == "--lr") {
      o.run.lr = detail::positive(flag, for_simulate());
    } else if (flag == "--async-lr") {
      o.run.async_lr = detail::positive(flag, for_simulate());
    } else if (flag == "--local-lr") {
      o.run.local_lr = detail::positive(flag, for_simulate());
    } else {
      detail::usage("unknown option '" + a.typed() + "'");
    }
  }
  if (simulate_only && !o.simulate)
    detail::usage("--fashion-mnist, --epochs, --target-accuracy, --lr, --async-lr and --local-lr set up --simulate's "
                  "runs: add --simulate, or leave them out");

  // The model: tensors, parameters, or Fashion-MNIST's MLP.
  if (tensors) {
    std::size_t sum = 0;
    bool matrices = false;  // shapes given: PowerSGD reads each matrix as the codec does
    for (const auto& t : *tensors) {
      o.work.tensors.push_back(t.elements());
      sum += t.elements();
      matrices = matrices || t.rank() > 1;
    }
    if (params && static_cast<std::size_t>(*params) != sum)
      detail::usage("--tensors add up to " + std::to_string(sum) + " parameters but --params says " +
                    std::to_string(*params) + ": give one of them, or make them agree");
    if (matrices) o.work.shapes = *tensors;
    o.work.parameters = sum;
  } else if (params) {
    o.work.parameters = static_cast<std::size_t>(*params);
  } else {
    o.work.tensors = fashion_mnist_tensors;
    o.work.shapes = fashion_mnist_shapes;
    o.work.parameters = 0;
    for (auto t : fashion_mnist_tensors) o.work.parameters += t;
  }
  if (o.work.parameters == 0) detail::usage("--tensors add up to 0 parameters: the model needs at least one");

  // The compute: measured, or modelled from flops.
  if (step && flops_per_sample)
    detail::usage("--step-compute and --flops-per-sample both give the compute: give one of them");
  if (step) {
    o.work.step_seconds = *step;
    o.compute_source = "--step-compute";
  } else {
    const double per_sample = flops_per_sample ? *flops_per_sample : 6.0 * double(o.work.parameters);
    o.work.step_seconds = per_sample * o.work.batch / device_flops;
    char text[160];
    std::snprintf(text, sizeof text, "%.4g flop/sample x batch %d / %.4g Gflop/s", per_sample, o.work.batch,
                  device_flops / 1e9);
    o.compute_source = text;
    if (!flops_per_sample) o.compute_source += " (6 x params; pass --step-compute for a measured time)";
  }

  // The cluster: text, file, or W hosts of one rank, or the default.
  if (cluster_text && cluster_file) detail::usage("--cluster and --cluster-file both describe the cluster: give one");
  if (cluster_file) {
    o.cluster = gradwire::plan::load_cluster_model(*cluster_file);
    o.cluster_text = "(from " + *cluster_file + ")";
  } else {
    o.cluster_text = cluster_text  ? *cluster_text
                     : workers     ? "hosts=" + std::to_string(*workers) + " ranks_per_host=1 bandwidth=1Gbit latency=50us"
                                   : "hosts=4 ranks_per_host=2 bandwidth=1Gbit latency=50us"s;
    o.cluster = gradwire::plan::parse_cluster_model(o.cluster_text);
  }
  const int w = o.cluster.size();
  if (workers && *workers != w)
    detail::usage("--workers " + std::to_string(*workers) + " but the cluster has " + std::to_string(o.cluster.hosts) +
                  " hosts x " + std::to_string(o.cluster.ranks_per_host) + " ranks = " + std::to_string(w) +
                  ": every rank is a worker, so set hosts and ranks_per_host to give " + std::to_string(*workers) +
                  " ranks (or leave --workers out)");

  o.servers = servers ? static_cast<int>(*servers) : std::max(1, w / 10);
  o.backup_workers = backups ? static_cast<int>(*backups) : std::max(1, w / 20);
  if (w < 2) detail::usage("the cluster has one rank: there is nothing to distribute (give hosts x ranks_per_host >= 2)");
  if (o.backup_workers >= w)
    detail::usage("--backup-workers " + std::to_string(o.backup_workers) + " leaves no worker: it must be below the " +
                  std::to_string(w) + " workers");
  if (o.period < 1) detail::usage("--period must be >= 1");
  if (compress != "none")
    for (std::size_t from = 0; from <= compress.size();) {
      const std::size_t comma = std::min(compress.find(',', from), compress.size());
      try {
        o.codecs.push_back(gradwire::plan::parse_codec(std::string_view(compress).substr(from, comma - from)));
      } catch (const gradwire::error& e) {
        detail::usage(e.details());
      }
      from = comma + 1;
    }
  if (o.simulate && o.work.tensors != fashion_mnist_tensors)
    detail::usage("--simulate trains the Fashion-MNIST MLP (examples/fashion_mnist): leave out --params and --tensors, "
                  "or leave out --simulate");
  o.work.validate();
  return o;
}

}  // namespace planner
