// The planner's command line: what model, workers, cluster and strategies to price (parse_plan_options).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <gradwire/error.hpp>
#include <gradwire/simulation/cluster_model.hpp>
#include <gradwire/simulation/cost_model.hpp>

namespace plan {

inline constexpr const char* usage_text =
    "usage: plan [options]\n"
    "Predicts step time and samples/s of every strategy and all-reduce algorithm on a described cluster\n"
    "(analytic cost models, gradwire/simulation/cost_model.hpp; docs/planning.md) and says which to choose.\n"
    "  --params P                 float32 parameters of the model (default: the Fashion-MNIST MLP,\n"
    "                             784-256-128-10: 235146 in 6 tensors)\n"
    "  --tensors N,N,...          the model's tensor sizes (their sum is P): exact PS shards and buckets;\n"
    "                             without it, a --params model is priced as many small tensors\n"
    "  --step-compute TIME        compute per step per worker at speed 1, measured: 2ms, 350us, 0.01s\n"
    "  --flops-per-sample X       ... or modelled: X flop per sample (default 6 x P: forward and backward)\n"
    "  --device-flops RATE        ... on a device of RATE flop/s: 50G, 2.5T (default 50G)\n"
    "  --batch B                  samples per worker per step (default 64)\n"
    "  --workers W                workers: every rank of the cluster (default: hosts x ranks_per_host; without\n"
    "                             --cluster, W hosts of one rank)\n"
    "  --cluster \"KEY=VALUE ...\"  the cluster (gradwire/simulation/cluster_model.hpp): hosts=25 ranks_per_host=4\n"
    "                             bandwidth=10Gbit latency=20us jitter=0.1 tail=0.02:1.5 ...\n"
    "                             (default: hosts=4 ranks_per_host=2 bandwidth=1Gbit latency=50us)\n"
    "  --cluster-file F           ... or read from F (the same keys, one or more a line, # comments)\n"
    "  --servers S                parameter servers, on S extra ranks after the workers (default W / 10, >= 1)\n"
    "  --backup-workers K         backup_workers<K>: a sync step closes after W - K gradients (default W / 20, >= 1)\n"
    "  --staleness S              bounded_staleness<S> (default 2)\n"
    "  --period H                 local SGD: average the parameters every H steps (default 8)\n"
    "  --trials N                 Monte Carlo steps per straggler statistic (default 2000)\n"
    "  --simulate                 also run the strategies in the simulator (virtual time) for time to accuracy\n"
    "  --help                     this text\n";

// Fashion-MNIST's MLP (examples/fashion_mnist/mlp.hpp): weights and biases of 784-256-128-10.
inline const std::vector<std::size_t> fashion_mnist_tensors = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};

struct plan_options {
  gradwire::simulation::cluster_model cluster;
  gradwire::simulation::workload work;
  std::string cluster_text;  // as given (or the default), for the report
  std::string compute_source;  // how work.step_seconds was found, for the report
  int servers = 1;
  int backup_workers = 1;
  int staleness = 2;
  int period = 8;
  int trials = gradwire::simulation::default_monte_carlo_trials;
  bool simulate = false;
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

// "2ms", "350us", "0.01s", "0.01" (seconds).
inline double seconds(std::string_view flag, std::string_view text) {
  std::string_view unit;
  const double v = number(flag, text, unit);
  double scale = 0;
  if (unit == "ns") scale = 1e-9;
  else if (unit == "us") scale = 1e-6;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "s" || unit.empty()) scale = 1;
  else usage(std::string(flag) + " expects a time such as 2ms, 350us or 0.01s, got '" + std::string(text) + "'");
  if (!(v > 0)) usage(std::string(flag) + " expects a time > 0, got '" + std::string(text) + "'");
  return v * scale;
}

// "50G", "2.5T", "1e9": a positive count with an optional K, M, G or T.
inline double count(std::string_view flag, std::string_view text) {
  std::string_view unit;
  const double v = number(flag, text, unit);
  double scale = 0;
  if (unit.empty()) scale = 1;
  else if (unit == "K") scale = 1e3;
  else if (unit == "M") scale = 1e6;
  else if (unit == "G") scale = 1e9;
  else if (unit == "T") scale = 1e12;
  else usage(std::string(flag) + " expects a number with an optional K, M, G or T, got '" + std::string(text) + "'");
  if (!(v > 0)) usage(std::string(flag) + " expects a number > 0, got '" + std::string(text) + "'");
  return v * scale;
}

inline std::vector<std::size_t> sizes(std::string_view flag, std::string_view text) {
  std::vector<std::size_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    out.push_back(static_cast<std::size_t>(integer(flag, text.substr(0, comma), 0)));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  if (out.empty()) usage(std::string(flag) + " expects tensor sizes such as 200704,256,32768");
  return out;
}

}  // namespace detail

// Reads the planner's options; throws gradwire::error(errc::invalid_argument) for a usage
// error and errc::config for a cluster description that does not parse, each saying what
// to change. --help sets `help` and nothing is checked.
inline plan_options parse_plan_options(int argc, const char* const* argv) {
  using namespace std::string_literals;
  plan_options o;
  std::optional<long long> params, workers, servers, backups;
  std::optional<std::vector<std::size_t>> tensors;
  std::optional<double> step, flops_per_sample;
  double device_flops = 50e9;
  std::optional<std::string> cluster_text, cluster_file;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i], value;
    bool has_value = false;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string_view {
      if (has_value) return value;
      if (i + 1 >= argc) detail::usage(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    } else if (flag == "--params") {
      params = detail::integer(flag, next(), 1);
    } else if (flag == "--tensors") {
      tensors = detail::sizes(flag, next());
    } else if (flag == "--step-compute") {
      step = detail::seconds(flag, next());
    } else if (flag == "--flops-per-sample") {
      flops_per_sample = detail::count(flag, next());
    } else if (flag == "--device-flops") {
      device_flops = detail::count(flag, next());
    } else if (flag == "--batch") {
      o.work.batch = static_cast<int>(detail::integer(flag, next(), 1));
    } else if (flag == "--workers") {
      workers = detail::integer(flag, next(), 1);
    } else if (flag == "--cluster") {
      cluster_text = std::string(next());
    } else if (flag == "--cluster-file") {
      cluster_file = std::string(next());
    } else if (flag == "--servers") {
      servers = detail::integer(flag, next(), 1);
    } else if (flag == "--backup-workers") {
      backups = detail::integer(flag, next(), 1);
    } else if (flag == "--staleness") {
      o.staleness = static_cast<int>(detail::integer(flag, next(), 0));
    } else if (flag == "--period") {
      o.period = static_cast<int>(detail::integer(flag, next(), 1));
    } else if (flag == "--trials") {
      o.trials = static_cast<int>(detail::integer(flag, next(), 1));
    } else if (flag == "--simulate") {
      o.simulate = true;
    } else {
      detail::usage("unknown option '" + std::string(argv[i]) + "'");
    }
    if (has_value && (flag == "--simulate")) detail::usage("--simulate takes no value");
  }

  // The model: tensors, parameters, or Fashion-MNIST's MLP.
  if (tensors) {
    std::size_t sum = 0;
    for (auto t : *tensors) sum += t;
    if (params && static_cast<std::size_t>(*params) != sum)
      detail::usage("--tensors add up to " + std::to_string(sum) + " parameters but --params says " +
                    std::to_string(*params) + ": give one of them, or make them agree");
    o.work.tensors = *tensors;
    o.work.parameters = sum;
  } else if (params) {
    o.work.parameters = static_cast<std::size_t>(*params);
  } else {
    o.work.tensors = fashion_mnist_tensors;
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
    o.cluster = gradwire::simulation::load_cluster_model(*cluster_file);
    o.cluster_text = "(from " + *cluster_file + ")";
  } else {
    o.cluster_text = cluster_text  ? *cluster_text
                     : workers     ? "hosts=" + std::to_string(*workers) + " ranks_per_host=1 bandwidth=1Gbit latency=50us"
                                   : "hosts=4 ranks_per_host=2 bandwidth=1Gbit latency=50us"s;
    o.cluster = gradwire::simulation::parse_cluster_model(o.cluster_text);
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
  o.work.validate();
  return o;
}

}  // namespace plan
