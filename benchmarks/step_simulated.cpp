// Predicted step time of the all-reduce strategy (multi_worker_mirrored) on a simulated cluster, in virtual time.
//
//   step_simulated --cluster "hosts=2 ranks_per_host=2 bandwidth=1Gbit ..." --compute 0.021 [--steps 40]
//                  [--warmup 3] [--tensors 200704,256,32768,128,1280,10] [--optimizer momentum|sgd]
//
// Every rank of the model runs the library's real strategy<host_tensor<float>, Optimizer,
// aggregation::all_reduce, transport::simulated> (the type examples/fashion_mnist trains
// with, on a simulated transport): per step simulation::compute(--compute seconds) stands
// for the forward and backward pass, then strategy.step(gradients) buckets, all-reduces
// and applies them. The default tensors are the Fashion-MNIST MLP's (784-256-128-10,
// 235146 parameters). Prints, as key=value words that benchmarks/validate_simulator.sh
// reads, the mean over ranks and timed steps of a step's virtual time and its split into
// compute and strategy.step, as fashion_mnist --timing splits a real one.
//
// compute=modelled unless the --cluster text says compute=measured: modelled charges
// only --compute and the network model; measured also counts each rank's CPU time inside
// strategy.step between transport calls (packing the bucket, the optimizer), as this
// machine runs it one rank at a time.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <gradwire/aggregation/all_reduce.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/sgd.hpp>
#include <gradwire/strategy.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#include <gradwire/transport/simulated.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gw = gradwire;
namespace sim = gradwire::simulation;

namespace {

struct options {
  std::string cluster, cluster_file;
  std::vector<std::size_t> tensors{784 * 256, 256, 256 * 128, 128, 128 * 10, 10};  // the Fashion-MNIST MLP
  double compute = 0;  // seconds of forward/backward per step per rank
  int steps = 40, warmup = 3;
  std::string optimizer = "momentum";
};

[[noreturn]] void usage(const char* program, const std::string& error = {}) {
  std::FILE* out = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(out, "%s: %s\n\n", program, error.c_str());
  std::fprintf(out,
               "%s: predicted step time of the all-reduce strategy on a simulated cluster (virtual time)\n"
               "usage: %s --cluster TEXT | --cluster-file FILE [flags]\n"
               "  --cluster TEXT        the cluster_model (transport/simulated/cluster_model.hpp), e.g.\n"
               "                        \"hosts=2 ranks_per_host=2 bandwidth=1Gbit latency=50us\"; compute=modelled\n"
               "                        unless it says otherwise\n"
               "  --cluster-file FILE   the same, from a file\n"
               "  --compute SECONDS     forward/backward per step per rank (default 0)\n"
               "  --steps N             timed steps (default 40)\n"
               "  --warmup N            untimed steps first (default 3)\n"
               "  --tensors LIST        parameter tensors' element counts (default: the Fashion-MNIST MLP,\n"
               "                        200704,256,32768,128,1280,10)\n"
               "  --optimizer NAME      momentum (default) or sgd\n",
               program, program);
  std::exit(error.empty() ? 0 : 2);
}

template <class T>
bool parse_number(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") usage(argv[0]);
    if (i + 1 >= argc) usage(argv[0], "flag " + std::string(flag) + " needs a value");
    const std::string_view value = argv[++i];
    bool ok = true;
    if (flag == "--cluster") o.cluster = value;
    else if (flag == "--cluster-file") o.cluster_file = value;
    else if (flag == "--compute") ok = parse_number(value, o.compute) && o.compute >= 0;
    else if (flag == "--steps") ok = parse_number(value, o.steps) && o.steps >= 1;
    else if (flag == "--warmup") ok = parse_number(value, o.warmup) && o.warmup >= 0;
    else if (flag == "--optimizer") {
      o.optimizer = value;
      ok = o.optimizer == "momentum" || o.optimizer == "sgd";
    }
    else if (flag == "--tensors") {
      o.tensors.clear();
      for (std::string_view rest = value; ok && !rest.empty();) {
        const auto comma = rest.find(',');
        std::size_t n = 0;
        ok = parse_number(rest.substr(0, comma), n);
        o.tensors.push_back(n);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      }
      ok = ok && !o.tensors.empty();
    } else usage(argv[0], "unknown flag " + std::string(flag));
    if (!ok) usage(argv[0], "bad value '" + std::string(value) + "' for " + std::string(flag));
  }
  if (o.cluster.empty() && o.cluster_file.empty()) usage(argv[0], "say which cluster: --cluster TEXT or --cluster-file FILE");
  return o;
}

// Per rank: the virtual seconds of each timed step's compute and strategy.step.
struct rank_times {
  std::vector<double> compute, step;
};

template <class Optimizer>
std::vector<rank_times> simulate(const sim::cluster_model& model, const options& o, Optimizer optimizer) {
  using strategy_type = gw::strategy<gw::host_tensor<float>, Optimizer, gw::aggregation::all_reduce, gw::transport::simulated>;
  std::vector<rank_times> out(static_cast<std::size_t>(model.size()));
  const auto compute = std::chrono::duration_cast<sim::duration>(std::chrono::duration<double>(o.compute));
  sim::run(model, [&](gw::transport::simulated t) {
    const auto me = static_cast<std::size_t>(t.rank());
    std::vector<gw::host_tensor<float>> parameters;
    std::vector<std::vector<float>> gradients;
    for (std::size_t i = 0; i < o.tensors.size(); ++i) {
      parameters.emplace_back(gw::shape{o.tensors[i]});
      std::fill_n(parameters.back().data(), o.tensors[i], 0.01f);
      gradients.emplace_back(o.tensors[i], 1e-3f * float(me + 1));  // small: the weights stay finite
    }
    const std::vector<std::span<const float>> views(gradients.begin(), gradients.end());
    strategy_type s(std::move(t), std::move(parameters), optimizer, gw::aggregation::all_reduce(),
                    {.timeout = std::chrono::seconds(120)});
    for (int k = 0; k < o.warmup + o.steps; ++k) {
      const sim::time_point begin = sim::now();
      sim::compute(compute);
      const sim::time_point computed = sim::now();
      s.step(views);
      const sim::time_point end = sim::now();
      if (k < o.warmup) continue;
      out[me].compute.push_back(double((computed - begin).count()) * 1e-9);
      out[me].step.push_back(double((end - computed).count()) * 1e-9);
    }
  });
  return out;
}

double mean_over(const std::vector<rank_times>& ranks, std::vector<double> rank_times::*part) {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& r : ranks)
    for (double x : r.*part) sum += x, ++n;
  return n ? sum / double(n) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    sim::cluster_model base;
    base.compute = sim::compute_model::modelled;
    if (!o.cluster_file.empty()) base = sim::load_cluster_model(o.cluster_file, base);
    const sim::cluster_model model = sim::parse_cluster_model(o.cluster, base);
    std::size_t parameters = 0;
    for (std::size_t n : o.tensors) parameters += n;
    const auto times = o.optimizer == "sgd" ? simulate(model, o, gw::optim::sgd({.lr = 0.05}))
                                            : simulate(model, o, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}));
    const double compute = mean_over(times, &rank_times::compute), step = mean_over(times, &rank_times::step);
    std::printf("# step_simulated: %s\n# %zu tensors, %zu parameters (%zu bytes of float32 gradient), optimizer %s, "
                "%d timed steps after %d; mean over ranks and steps, virtual seconds\n",
                sim::describe(model).c_str(), o.tensors.size(), parameters, parameters * sizeof(float),
                o.optimizer.c_str(), o.steps, o.warmup);
    std::printf("step_seconds=%.6f compute_seconds=%.6f strategy_step_seconds=%.6f\n", compute + step, compute, step);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_simulated: %s\n", e.what());
    return 1;
  }
}
