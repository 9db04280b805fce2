// Trains a 784-256-128-10 MLP on Fashion-MNIST with gradwire's one_device, mirrored,
// multi_worker_mirrored, central_storage, local_sgd or parameter_server strategy.
//
//   fashion_mnist [--strategy one_device|mirrored|multi_worker_mirrored|central_storage|local_sgd|parameter_server]
//                 [--transport inproc|tcp|ucx|simulated] [--replicas N] [--owner R] [--period H]
//                 [--cluster MODEL] [--step-compute SECONDS] [--evals-per-epoch K]
//                 [--ps S] [--ps-mode sync|async|bounded:S|backup:B] [--checkpoint-dir D] [--checkpoint-every K]
//                 [--epochs E] [--batch B] [--lr LR] [--optimizer sgd|momentum|adam|adamw]
//                 [--data DIR] [--seed S] [--schedule cosine|constant] [--standardise]
//                 [--threads T] [--target-accuracy A] [--straggler RANK:FACTOR] [--timing]
//
// With mirrored (and central_storage / local_sgd over --transport inproc), N replicas run
// as threads; with multi_worker_mirrored (and the others over --transport tcp), one
// replica per process, started by a launcher (scripts/gradwire-run, mpirun, srun,
// TF_CONFIG). Either way each global step takes N*B samples of the shuffled epoch and
// replica r trains on samples [r*B, (r+1)*B) of them (like PyTorch's DistributedSampler),
// so N synchronous replicas of batch B follow the same trajectory as one device with
// batch N*B. With --transport simulated the replicas (and servers) run as threads in virtual
// time on the cluster --cluster describes (gradwire/simulation/), and every time printed
// is virtual: the training is real, its duration is the model's.
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <gradwire/checkpoint.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/error.hpp>
#include <gradwire/optim/adam.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/sgd.hpp>
#include <gradwire/strategy.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#include <gradwire/simulation/transport.hpp>
#include <gradwire/support/virtual_clock.hpp>
#include <gradwire/transport/inproc.hpp>
#if GRADWIRE_HAS_ASIO
#include <gradwire/asio.hpp>
#endif
#if GRADWIRE_HAS_UCX
#include <gradwire/ucx.hpp>
#endif

#include "cuda_training.hpp"
#include "idx.hpp"
#include "mlp.hpp"

namespace {

using steady = gradwire::support::step_clock;  // virtual time on a simulated rank
using model_type = fashion_mnist::mlp<float>;
using matrix = model_type::matrix;

constexpr const char* usage_text =
    "usage: fashion_mnist [options]\n"
    "  --strategy one_device|mirrored|multi_worker_mirrored|central_storage|local_sgd|parameter_server\n"
    "                                   training strategy (default one_device); multi_worker_mirrored runs one\n"
    "                                   replica per process: start it with scripts/gradwire-run -n N, mpirun -np N,\n"
    "                                   srun or TF_CONFIG\n"
    "  --transport inproc|tcp|ucx       central_storage, local_sgd: replicas as threads of this process (inproc,\n"
    "                                   the default) or one per process under a launcher (tcp, as\n"
    "                                   multi_worker_mirrored, or ucx: UCX, with UCX_TLS choosing shared memory,\n"
    "                                   TCP or RDMA); mirrored is inproc, multi_worker_mirrored tcp or ucx;\n"
    "                                   simulated (any strategy but one_device): replicas and servers as threads\n"
    "                                   in virtual time on the cluster --cluster describes; times are virtual\n"
    "  --cluster MODEL                  simulated: the cluster, e.g. \"hosts=25 ranks_per_host=4 bandwidth=10Gbit\n"
    "                                   latency=20us compute=modelled jitter=0.1 tail=0.02:2\" (docs/planning.md);\n"
    "                                   without hosts= every rank is a host of its own\n"
    "  --step-compute SECONDS           simulated: each forward/backward also takes SECONDS of virtual time\n"
    "                                   (with compute=modelled, the only compute counted: runs are exactly\n"
    "                                   reproducible)\n"
    "  --evals-per-epoch K              evaluate the test set K times per epoch (default 1): the accuracy curve\n"
    "  --device cpu|cuda                where the model and its parameters live (default cpu); cuda: the MLP on\n"
    "                                   cuBLAS and gradwire's strategies over cuda_tensor, for one_device,\n"
    "                                   mirrored and central_storage (threads, one stream each, on one GPU), and\n"
    "                                   multi_worker_mirrored / central_storage over tcp or ucx (one process per\n"
    "                                   replica, each on the GPU its local rank picks)\n"
    "  --replicas N                     threads: replicas, one thread each (default 2); one_device: must be 1;\n"
    "                                   tcp: the launcher's world size (may be left out)\n"
    "  --owner R                        central_storage: the rank that sums gradients and applies the optimizer\n"
    "                                   (default 0)\n"
    "  --period H                       local_sgd: average the parameters every H local steps (default 8)\n"
    "  --ps S                           parameter_server over inproc: S of the threads serve (default 1); over tcp\n"
    "                                   the launcher says (scripts/gradwire-run -n N --ps S, or TF_CONFIG's ps)\n"
    "  --ps-mode M                      parameter_server: sync (default), async, bounded:S (S in 1, 2, 4) or\n"
    "                                   backup:B (B in 1, 2); the servers run the lr schedule\n"
    "  --checkpoint-dir D               save checkpoints in D and resume from them: the chief saves model.ckpt\n"
    "                                   (local_sgd: every rank its model-rank-R.ckpt; parameter_server: every\n"
    "                                   server its shard); a restarted run skips the steps already done\n"
    "  --checkpoint-every K             ... every K steps as well as at exit (default 0: at exit only;\n"
    "                                   local_sgd: a multiple of --period)\n"
    "  --epochs E                       passes over the training set (default 10)\n"
    "  --batch B                        samples per replica per step (default 64)\n"
    "  --lr LR                          learning rate (default: adam/adamw 1e-3, momentum 0.01, sgd 0.1)\n"
    "  --optimizer sgd|momentum|adam|adamw   (default adam)\n"
    "  --data DIR                       directory of the gzip'd idx files\n"
    "                                   (default /usr/share/datasets/fashion-mnist)\n"
    "  --seed S                         seed of initialisation and shuffling (default 1)\n"
    "  --schedule cosine|constant       learning rate over the run: cosine decay to 0, or fixed (default cosine)\n"
    "  --standardise                    shift/scale pixels by the training set's mean/std (default: [0, 1])\n"
    "  --threads T                      Eigen threads per process (default 1; needs a build with OpenMP)\n"
    "  --target-accuracy A              report when test accuracy first reaches A, in (0, 1] (default 0.88)\n"
    "  --straggler RANK:FACTOR          replica RANK sleeps after each forward/backward so that it takes FACTOR\n"
    "                                   (>= 1) times as long, e.g. 1:3\n"
    "  --timing                         per epoch, also print rank-mean seconds in forward/backward and in step\n"
    "  --help                           this text\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string strategy = "one_device";
  std::string device = "cpu";
  std::string transport;  // inproc or tcp; empty until parse() picks the strategy's default
  int replicas = 0;       // 0: the strategy's default
  std::optional<int> owner;   // central_storage only
  std::optional<int> period;  // local_sgd only
  int epochs = 10;
  int batch = 64;
  std::optional<double> lr;
  std::string optimizer = "adam";
  std::string data = fashion_mnist::default_data_dir;
  std::uint64_t seed = 1;
  std::string schedule = "cosine";
  bool standardise = false;
  int threads = 1;  // one per process, so N processes on N cores do not oversubscribe
  double target_accuracy = 0.88;
  bool timing = false;
  int straggler_rank = -1;  // -1: no straggler
  double straggler_factor = 1;
  // parameter_server only
  int servers = 0;             // inproc: server threads (tcp: from the launcher)
  std::string ps_mode = "sync";
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  // simulated only
  std::string cluster;        // simulation::parse_cluster_model text
  std::chrono::nanoseconds step_compute{};  // virtual time per forward/backward (0: none)
  int evals_per_epoch = 1;
};

// One replica per process, under a launcher (tcp or ucx), rather than threads.
bool uses_tcp(const options& o) { return o.transport == "tcp" || o.transport == "ucx"; }

template <class Int>
Int parse_int(std::string_view flag, std::string_view text, Int min) {
  Int value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min)
    throw usage_error(std::string(flag) + " expects an integer >= " + std::to_string(min) + ", got '" +
                      std::string(text) + "'");
  return value;
}

double parse_positive(std::string_view flag, std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value <= 0)
    throw usage_error(std::string(flag) + " expects a positive number, got '" + std::string(text) + "'");
  return value;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i], value;
    bool has_value = false;
    // Accept both "--flag value" and "--flag=value".
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string_view {
      if (has_value) return value;
      if (i + 1 >= argc) throw usage_error(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    } else if (flag == "--strategy") {
      o.strategy = next();
      if (o.strategy != "one_device" && o.strategy != "mirrored" && o.strategy != "multi_worker_mirrored" &&
          o.strategy != "central_storage" && o.strategy != "local_sgd" && o.strategy != "parameter_server")
        throw usage_error(
            "--strategy must be one_device, mirrored, multi_worker_mirrored, central_storage, local_sgd or "
            "parameter_server, got '" +
            o.strategy + "'");
    } else if (flag == "--device") {
      o.device = next();
      if (o.device != "cpu" && o.device != "cuda")
        throw usage_error("--device must be cpu or cuda, got '" + o.device + "'");
    } else if (flag == "--transport") {
      o.transport = next();
      if (o.transport != "inproc" && o.transport != "tcp" && o.transport != "ucx" && o.transport != "simulated")
        throw usage_error("--transport must be inproc, tcp, ucx or simulated, got '" + o.transport + "'");
    } else if (flag == "--cluster") {
      o.cluster = next();
    } else if (flag == "--step-compute") {
      o.step_compute = std::chrono::nanoseconds(std::llround(parse_positive(flag, next()) * 1e9));
    } else if (flag == "--evals-per-epoch") {
      o.evals_per_epoch = parse_int<int>(flag, next(), 1);
    } else if (flag == "--owner") {
      o.owner = parse_int<int>(flag, next(), 0);
    } else if (flag == "--period") {
      o.period = parse_int<int>(flag, next(), 1);
    } else if (flag == "--straggler") {
      const std::string_view text = next();
      const auto colon = text.find(':');
      if (colon == std::string_view::npos)
        throw usage_error("--straggler expects RANK:FACTOR, e.g. 1:3, got '" + std::string(text) + "'");
      o.straggler_rank = parse_int<int>("--straggler's RANK", text.substr(0, colon), 0);
      o.straggler_factor = parse_positive("--straggler's FACTOR", text.substr(colon + 1));
      if (o.straggler_factor < 1)
        throw usage_error("--straggler's FACTOR must be >= 1 (how many times slower the replica runs), got '" +
                          std::string(text.substr(colon + 1)) + "'");
    } else if (flag == "--replicas") {
      o.replicas = parse_int<int>(flag, next(), 1);
    } else if (flag == "--ps") {
      o.servers = parse_int<int>(flag, next(), 1);
    } else if (flag == "--ps-mode") {
      o.ps_mode = next();
      static const char* modes[] = {"sync",     "async",    "bounded:1", "bounded:2", "bounded:4",
                                    "backup:1", "backup:2", "backup:4",  "backup:8"};
      if (std::find(std::begin(modes), std::end(modes), o.ps_mode) == std::end(modes))
        throw usage_error("--ps-mode must be sync, async, bounded:1|2|4 or backup:1|2|4|8, got '" + o.ps_mode + "'");
    } else if (flag == "--checkpoint-dir") {
      o.checkpoint_dir = next();
    } else if (flag == "--checkpoint-every") {
      o.checkpoint_every = parse_int<std::uint64_t>(flag, next(), 1);
    } else if (flag == "--epochs") {
      o.epochs = parse_int<int>(flag, next(), 1);
    } else if (flag == "--batch") {
      o.batch = parse_int<int>(flag, next(), 1);
    } else if (flag == "--lr") {
      o.lr = parse_positive(flag, next());
    } else if (flag == "--optimizer") {
      o.optimizer = next();
      if (o.optimizer != "sgd" && o.optimizer != "momentum" && o.optimizer != "adam" && o.optimizer != "adamw")
        throw usage_error("--optimizer must be sgd, momentum, adam or adamw, got '" + o.optimizer + "'");
    } else if (flag == "--data") {
      o.data = next();
      if (o.data.empty()) throw usage_error("--data needs a directory");
    } else if (flag == "--seed") {
      o.seed = parse_int<std::uint64_t>(flag, next(), 0);
    } else if (flag == "--schedule") {
      o.schedule = next();
      if (o.schedule != "cosine" && o.schedule != "constant")
        throw usage_error("--schedule must be cosine or constant, got '" + o.schedule + "'");
    } else if (flag == "--standardise" || flag == "--standardize") {
      if (has_value) throw usage_error(std::string(flag) + " takes no value");
      o.standardise = true;
    } else if (flag == "--threads") {
      o.threads = parse_int<int>(flag, next(), 1);
    } else if (flag == "--target-accuracy") {
      const std::string_view text = next();
      o.target_accuracy = parse_positive(flag, text);
      if (o.target_accuracy > 1)
        throw usage_error("--target-accuracy is a fraction in (0, 1], e.g. 0.88, got '" + std::string(text) + "'");
    } else if (flag == "--timing") {
      if (has_value) throw usage_error(std::string(flag) + " takes no value");
      o.timing = true;
    } else {
      throw usage_error("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  // mirrored and multi_worker_mirrored are the same all-reduce strategy on threads and on
  // processes; the names fix the transport, so a contradicting --transport is an error.
  const std::string fixed_transport = o.strategy == "multi_worker_mirrored" ? "tcp"
                                      : (o.strategy == "mirrored" || o.strategy == "one_device") ? "inproc"
                                                                                                 : "";
  if (!fixed_transport.empty() && !o.transport.empty() && o.transport != fixed_transport &&
      !(fixed_transport == "tcp" && o.transport == "ucx") && !(o.transport == "simulated" && o.strategy != "one_device"))
    throw usage_error("--strategy " + o.strategy + " runs " +
                      (fixed_transport == "tcp" ? "one replica per process (tcp)" : "in this process (inproc)") +
                      (fixed_transport == "tcp" ? "; use --strategy mirrored for threads"
                                                : "; use --strategy multi_worker_mirrored for processes"));
  if (o.transport.empty()) o.transport = fixed_transport.empty() ? "inproc" : fixed_transport;
  if (o.owner && o.strategy != "central_storage")
    throw usage_error("--owner is for --strategy central_storage, not " + o.strategy);
  if (o.period && o.strategy != "local_sgd")
    throw usage_error("--period is for --strategy local_sgd, not " + o.strategy);
  const bool ps = o.strategy == "parameter_server";
  if (!ps && (o.servers || o.ps_mode != "sync"))
    throw usage_error("--ps and --ps-mode are for --strategy parameter_server");
  if (o.checkpoint_every && o.checkpoint_dir.empty()) throw usage_error("--checkpoint-every needs --checkpoint-dir");
  const bool simulated = o.transport == "simulated";
  if (!simulated && (!o.cluster.empty() || o.step_compute.count() > 0))
    throw usage_error("--cluster and --step-compute are for --transport simulated");
  if (simulated && o.straggler_rank >= 0)
    throw usage_error("--straggler sleeps, which takes no virtual time: with --transport simulated slow a rank in "
                      "--cluster instead (slow=RANK:FACTOR)");
  if (ps) {
    if (uses_tcp(o) && o.servers)
      throw usage_error("--ps S is for threads; over tcp the launcher says (scripts/gradwire-run -n N --ps S)");
    if (!uses_tcp(o) && !o.servers) o.servers = 1;
  }
  if (o.strategy == "central_storage" && !o.owner) o.owner = 0;
  if (o.strategy == "local_sgd" && !o.period) o.period = 8;
  // A resumed local_sgd run restarts its averaging count, so it must stop on an averaging point.
  if (o.strategy == "local_sgd" && o.checkpoint_every % static_cast<std::uint64_t>(*o.period) != 0)
    throw usage_error("--checkpoint-every " + std::to_string(o.checkpoint_every) + " with local_sgd must be a multiple of "
                      "--period " + std::to_string(*o.period));
  if (o.strategy == "one_device") {
    if (o.replicas > 1)
      throw usage_error("--strategy one_device trains one replica; use --strategy mirrored for --replicas " +
                        std::to_string(o.replicas));
    o.replicas = 1;
  } else if (!uses_tcp(o) && o.replicas == 0) {
    o.replicas = 2;
  }  // tcp: the launcher decides; a given --replicas is checked against it (process_rank)
  // With threads the replica count is known now; over tcp process_rank checks these.
  if (!uses_tcp(o)) {
    if (o.owner && *o.owner >= o.replicas)
      throw usage_error("--owner " + std::to_string(*o.owner) + " is not a rank of " + std::to_string(o.replicas) +
                        " replica(s) (ranks 0.." + std::to_string(o.replicas - 1) + ")");
    if (o.straggler_rank >= o.replicas)
      throw usage_error("--straggler rank " + std::to_string(o.straggler_rank) + " is not a rank of " +
                        std::to_string(o.replicas) + " replica(s) (ranks 0.." + std::to_string(o.replicas - 1) + ")");
  }
  if (o.device == "cuda") {
#if !GRADWIRE_HAS_CUDA
    throw usage_error("--device cuda: this build has no CUDA (gradwire::cuda: reconfigure where nvcc is found)");
#endif
    if (o.strategy != "one_device" && o.strategy != "mirrored" && o.strategy != "multi_worker_mirrored" &&
        o.strategy != "central_storage")
      throw usage_error("--device cuda trains one_device, mirrored, multi_worker_mirrored or central_storage, not " +
                        o.strategy);
    if (!o.checkpoint_dir.empty() || o.straggler_rank >= 0 || o.timing)
      throw usage_error("--device cuda does not take --checkpoint-dir, --straggler or --timing yet");
  }
#if !defined(_OPENMP)
  if (o.threads > 1)
    throw usage_error("--threads " + std::to_string(o.threads) +
                      ": this build has no OpenMP, so Eigen runs on one thread (reconfigure with OpenMP found)");
#endif
  if (!o.lr) o.lr = (o.optimizer == "sgd") ? 0.1 : (o.optimizer == "momentum") ? 0.01 : 1e-3;
  return o;
}

// What rank 0 measured, for the summary printed after the replicas have joined.
struct summary {
  bool chief = false;  // this process holds rank 0 and prints the summary
  double final_accuracy = 0;
  double total_seconds = 0;
  double epoch_reached = 0;  // first evaluation (in epochs) with test accuracy >= target; 0: never
  double seconds_reached = 0;

  // The chief's evaluation after `epochs` (fractional with --evals-per-epoch); also
  // printed as a "curve" line, for plots of accuracy against time.
  void record(double epochs, double accuracy, double elapsed, double target) {
    chief = true;
    final_accuracy = accuracy;
    total_seconds = elapsed;
    if (epoch_reached == 0 && accuracy >= target) {
      epoch_reached = epochs;
      seconds_reached = elapsed;
    }
    std::printf("curve epochs=%.4f seconds=%.6f accuracy=%.4f\n", epochs, elapsed, accuracy);
    std::fflush(stdout);
  }
};

// This replica's batch: samples order[first .. first + y.size()) into x's columns and y.
void load_batch(const fashion_mnist::fashion_mnist_data<float>& data, std::span<const std::size_t> order,
                std::size_t first, matrix& x, std::vector<int>& y) {
  for (std::size_t j = 0; j < y.size(); ++j) {
    const std::size_t sample = order[first + j];
    x.col(static_cast<Eigen::Index>(j)) = data.train.images.col(static_cast<Eigen::Index>(sample));
    y[j] = data.train.labels[sample];
  }
}

// local_sgd's replicas differ between averaging points; evaluation needs their average.
template <class Aggregation>
inline constexpr bool averages_parameters = false;
template <int H>
inline constexpr bool averages_parameters<gradwire::aggregation::averaging<H>> = true;

// One replica's training loop, the same for every strategy. All replicas see the same
// permutation per epoch and take their own B-sample slice of each global batch.
template <class Strategy>
void train_replica(Strategy& strategy, model_type& model, const fashion_mnist::fashion_mnist_data<float>& data,
                   const options& o, summary& out) {
  const int rank = strategy.rank(), replicas = strategy.size();
  const auto batch = static_cast<std::size_t>(o.batch);
  const std::size_t global_batch = batch * static_cast<std::size_t>(replicas);
  const std::size_t n_train = data.train.size();
  // The last incomplete global batch is dropped (DistributedSampler's drop_last):
  // uneven replica batches would break the equivalence with one device.
  const std::size_t steps = n_train / global_batch;
  if (steps == 0)
    throw std::runtime_error("global batch " + std::to_string(global_batch) + " (replicas x batch) exceeds the " +
                             std::to_string(n_train) + " training samples");

  // Each replica evaluates its share of the test set; the counts are summed.
  const std::size_t n_test = data.test.size();
  const std::size_t test_begin = n_test * static_cast<std::size_t>(rank) / static_cast<std::size_t>(replicas);
  const std::size_t test_end = n_test * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(replicas);
  const auto test_x = data.test.images.middleCols(static_cast<Eigen::Index>(test_begin),
                                                  static_cast<Eigen::Index>(test_end - test_begin));
  const std::span<const int> test_y = std::span<const int>(data.test.labels).subspan(test_begin, test_end - test_begin);

  std::vector<std::size_t> order(n_train);
  std::iota(order.begin(), order.end(), std::size_t{0});
  matrix x(model.sizes().input, static_cast<Eigen::Index>(batch));
  std::vector<int> y(batch);
  auto gradients = model.gradient_views();

  if (rank == 0) {
    std::string detail;
    if (o.owner) detail = " (owner " + std::to_string(*o.owner) + ")";
    if (o.period) detail = " (period " + std::to_string(*o.period) + ")";
    std::printf("strategy %s%s over %s, replicas %d, optimizer %s, lr %g (%s), batch %zu per replica (%zu global), "
                "%zu steps/epoch, %zu parameters\n",
                o.strategy.c_str(), detail.c_str(), o.transport.c_str(), replicas, o.optimizer.c_str(), *o.lr,
                o.schedule.c_str(), batch, global_batch, steps, model.parameter_count());
    if (o.straggler_rank >= 0)
      std::printf("straggler: rank %d runs %g x slower\n", o.straggler_rank, o.straggler_factor);
    std::fflush(stdout);
  }
  const bool straggling = rank == o.straggler_rank && o.straggler_factor > 1;

  // local_sgd: evaluate a copy holding the replicas' average, so that evaluating neither
  // shows one replica's drifted model nor adds an averaging step to training.
  constexpr bool averaging = averages_parameters<typename Strategy::aggregation_type>;
  std::optional<model_type> averaged;
  std::vector<float> flat;
  if constexpr (averaging) flat.resize(model.parameter_count());

  // Cosine decay from lr to 0 over the run, set per step: the last epochs average out
  // the noise of the step, so the final accuracy does not depend on where it stopped.
  const std::size_t total_steps = steps * static_cast<std::size_t>(o.epochs);
  auto set_lr = [&](std::size_t global_step) {
    if (o.schedule != "cosine") return;
    constexpr double pi = 3.14159265358979323846;
    strategy.optimizer().set_lr(*o.lr * 0.5 * (1.0 + std::cos(pi * double(global_step) / double(total_steps))));
  };

  // Checkpoints: replicas of every strategy but local_sgd hold the same parameters, so one
  // rank saves one file that every rank loads: the chief, or central_storage's owner (the
  // only rank whose optimizer state is used); local_sgd replicas each save and load their own.
  std::filesystem::path checkpoint;
  std::uint64_t resumed = 0;  // global steps already done by the run this one resumes
  if (!o.checkpoint_dir.empty()) {
    std::filesystem::create_directories(o.checkpoint_dir);
    checkpoint = std::filesystem::path(o.checkpoint_dir) /
                 (averaging ? "model-rank-" + std::to_string(rank) + ".ckpt" : std::string("model.ckpt"));
    if (std::filesystem::exists(checkpoint)) {
      resumed = gradwire::load_checkpoint(checkpoint, strategy);
      if (rank == 0)
        std::printf("resumed from %s at step %llu of %llu%s\n", checkpoint.c_str(), (unsigned long long)resumed,
                    (unsigned long long)(steps * static_cast<std::uint64_t>(o.epochs)),
                    resumed >= steps * static_cast<std::uint64_t>(o.epochs) ? ": the run is complete" : "");
    }
  }
  auto save = [&](std::uint64_t done) {
    const int saver = o.strategy == "central_storage" ? o.owner.value_or(0) : 0;
    if (!checkpoint.empty() && (rank == saver || averaging)) gradwire::save_checkpoint(checkpoint, strategy, done);
  };

  // This replica's correct predictions on its share of the test set, after `steps_so_far`
  // global steps (collective: every replica calls it at the same step).
  auto test_correct = [&](std::size_t steps_so_far) {
    model_type* evaluated = &model;
    if constexpr (averaging) {
      // Every rank counts the same steps, so all agree whether the last one averaged.
      if (replicas > 1 && steps_so_far % static_cast<std::size_t>(*o.period) != 0) {
        std::size_t offset = 0;
        for (const auto& p : model.parameter_views()) {
          std::copy_n(p.data(), p.size(), flat.data() + offset);
          offset += p.size();
        }
        gradwire::collective::all_reduce(strategy.communicator(), std::span<float>(flat),
                                         gradwire::collective::reduce_op::average);
        if (!averaged) averaged.emplace(model);
        offset = 0;
        for (auto& p : averaged->parameter_views()) {
          std::copy_n(flat.data() + offset, p.size(), p.data());
          offset += p.size();
        }
        evaluated = &*averaged;
      }
    }
    std::size_t correct = 0;
    for (Eigen::Index begin = 0; begin < test_x.cols(); begin += 1000) {
      const Eigen::Index n = std::min<Eigen::Index>(1000, test_x.cols() - begin);
      correct += evaluated->count_correct(test_x.middleCols(begin, n),
                                          test_y.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)));
    }
    return double(correct);
  };
  // --evals-per-epoch K: the test accuracy every steps/K steps as well as at each epoch's end.
  const std::size_t eval_every = o.evals_per_epoch > 1 ? std::max<std::size_t>(1, steps / o.evals_per_epoch) : 0;

  const auto start = steady::now();
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    // Same seed on every replica: the same permutation everywhere, a new one per epoch.
    std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    if (static_cast<std::uint64_t>(epoch) * steps <= resumed) continue;  // done before the restart

    const auto epoch_start = steady::now();
    double loss_sum = 0;
    std::size_t steps_done = 0;  // fewer than steps in an epoch resumed from a checkpoint
    // Where a replica's step time goes: its own forward/backward vs strategy.step
    // (all-reduce, waiting for the slowest replica, optimizer).
    steady::duration compute_time{}, step_time{};
    gradwire::observe::step_stats epoch_stats;  // this replica's steps: bytes, communication vs compute
    for (std::size_t step = 0; step < steps; ++step) {
      const std::uint64_t global_step = static_cast<std::uint64_t>(epoch - 1) * steps + step;
      if (global_step < resumed) continue;
      const auto step_start = steady::now();
      load_batch(data, order, step * global_batch + static_cast<std::size_t>(rank) * batch, x, y);
      loss_sum += model.loss_and_gradient(x, y);
      gradwire::simulation::compute(o.step_compute);  // modelled work: nothing unless simulated
      // A simulated slow replica: sleeping (FACTOR - 1) x its own compute time makes its
      // forward/backward take FACTOR times as long (--timing counts the sleep there).
      if (straggling)
        std::this_thread::sleep_for((steady::now() - step_start) * (o.straggler_factor - 1));
      set_lr(static_cast<std::size_t>(epoch - 1) * steps + step);
      const auto computed = steady::now();
      strategy.step(gradients);
      epoch_stats += strategy.last_step_stats();
      compute_time += computed - step_start;
      step_time += steady::now() - computed;
      ++steps_done;
      if (o.checkpoint_every && (global_step + 1) % o.checkpoint_every == 0) save(global_step + 1);
      if (eval_every && (step + 1) % eval_every == 0 && step + 1 < steps) {
        double correct = test_correct(static_cast<std::size_t>(global_step + 1));
        gradwire::collective::all_reduce(strategy.communicator(), std::span<double>(&correct, 1));
        if (rank == 0)
          out.record(double(epoch - 1) + double(step + 1) / double(steps), correct / double(n_test),
                     std::chrono::duration<double>(steady::now() - start).count(), o.target_accuracy);
      }
    }
    const double train_seconds = std::chrono::duration<double>(steady::now() - epoch_start).count();

    // {sum of per-step mean losses, steps, correct test predictions, compute and step
    // seconds} summed over all replicas.
    std::array<double, 5> stats{loss_sum, double(steps_done), 0.0, std::chrono::duration<double>(compute_time).count(),
                                std::chrono::duration<double>(step_time).count()};
    stats[2] = test_correct(static_cast<std::size_t>(epoch) * steps);
    gradwire::collective::all_reduce(strategy.communicator(), std::span<double>(stats));

    if (rank == 0) {
      const double elapsed = std::chrono::duration<double>(steady::now() - start).count();
      const double accuracy = stats[2] / double(n_test);
      std::printf("epoch %2d/%d  train_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %6.1f s", epoch,
                  o.epochs, stats[0] / stats[1], 100.0 * accuracy,
                  double(steps_done * global_batch) / train_seconds, elapsed);
      if (o.timing)
        std::printf("  [per replica: forward/backward %.2f s, step %.2f s, of %.2f s]", stats[3] / replicas,
                    stats[4] / replicas, train_seconds);
      std::printf("\n          rank 0: %s\n", gradwire::observe::to_string(epoch_stats).c_str());
      std::fflush(stdout);
      out.record(epoch, accuracy, elapsed, o.target_accuracy);
    }
  }
  save(steps * static_cast<std::uint64_t>(o.epochs));
}

// parameter_server: servers serve; workers step until the servers have done a run's worth
// of work (sync modes: epochs x steps versions; async modes: as many gradients applied as
// sync training would apply, so fast workers take on a straggler's share). Each worker
// takes its slice of every global batch, by its own step count; the chief evaluates the
// model it pulled on the whole test set each time the servers' progress crosses an epoch.
template <class Strategy>
void train_ps_replica(Strategy& strategy, model_type& model, const fashion_mnist::fashion_mnist_data<float>& data,
                      const options& o, summary& out) {
  using mode = typename Strategy::aggregation_type::mode;
  if (strategy.is_server()) {
    const auto st = strategy.serve();
    std::uint64_t pushes = 0;
    for (auto p : st.pushes) pushes += p;
    std::printf("ps rank %d: mode %s version %llu updates %llu gradients %llu applied %llu dropped %llu "
                "staleness mean %.2f p50 %llu p99 %llu max %llu update_lag mean %.2f p50 %llu p99 %llu max %llu "
                "max_lead %llu lost_workers %zu rejoined_workers %zu\n",
                strategy.rank(), mode::name, (unsigned long long)st.version, (unsigned long long)st.updates,
                (unsigned long long)pushes, (unsigned long long)st.applied, (unsigned long long)st.dropped,
                gradwire::ps::histogram_mean(st.staleness),
                (unsigned long long)gradwire::ps::histogram_quantile(st.staleness, 0.5),
                (unsigned long long)gradwire::ps::histogram_quantile(st.staleness, 0.99),
                (unsigned long long)(st.staleness.empty() ? 0 : st.staleness.size() - 1),
                gradwire::ps::histogram_mean(st.update_lag),
                (unsigned long long)gradwire::ps::histogram_quantile(st.update_lag, 0.5),
                (unsigned long long)gradwire::ps::histogram_quantile(st.update_lag, 0.99),
                (unsigned long long)(st.update_lag.empty() ? 0 : st.update_lag.size() - 1),
                (unsigned long long)st.max_lead, st.lost_workers.size(), st.rejoined_workers.size());
    std::fflush(stdout);
    return;
  }
  const int rank = strategy.rank();
  const int workers = strategy.size() - strategy.aggregation().servers();
  const auto batch = static_cast<std::size_t>(o.batch);
  const std::size_t global_batch = batch * static_cast<std::size_t>(workers);
  const std::size_t n_train = data.train.size();
  const std::size_t steps = n_train / global_batch;
  if (steps == 0) throw std::runtime_error("global batch exceeds the training set");
  const std::uint64_t total = steps * static_cast<std::uint64_t>(o.epochs);
  auto progress = [&] {  // in epochs' worth of server work
    const auto& ps = strategy.aggregation();
    return mode::on_arrival ? double(ps.applied()) / double(steps * static_cast<std::size_t>(workers))
                            : double(ps.version()) / double(steps);
  };
  if (rank == 0) {
    std::printf("strategy parameter_server (%s) over %s, %d workers + %d servers, optimizer %s, lr %g (%s), "
                "batch %zu per worker (%zu global), %zu steps/epoch, %zu parameters\n",
                o.ps_mode.c_str(), o.transport.c_str(), workers, strategy.aggregation().servers(), o.optimizer.c_str(),
                *o.lr, o.schedule.c_str(), batch, global_batch, steps, model.parameter_count());
    if (o.straggler_rank >= 0) std::printf("straggler: rank %d runs %g x slower\n", o.straggler_rank, o.straggler_factor);
    std::fflush(stdout);
  }
  const bool straggling = rank == o.straggler_rank && o.straggler_factor > 1;
  std::vector<std::size_t> order(n_train);
  std::iota(order.begin(), order.end(), std::size_t{0});
  matrix x(model.sizes().input, static_cast<Eigen::Index>(batch));
  std::vector<int> y(batch);
  auto gradients = model.gradient_views();
  const auto start = steady::now();
  int evaluated_epochs = 0;
  std::uint64_t my_steps = 0;
  gradwire::observe::step_stats epoch_stats;  // worker 0's steps since the last evaluation
  // Evaluations are numbered 1, 2, ...: K per epoch of the servers' progress.
  const int per_epoch = o.evals_per_epoch;
  auto evaluate = [&](int evaluation) {
    const double accuracy = model.accuracy(data.test.images, data.test.labels);
    const double elapsed = std::chrono::duration<double>(steady::now() - start).count();
    const double epochs = std::min(double(o.epochs), double(evaluation) / per_epoch);
    if (evaluation % per_epoch == 0 || epochs >= o.epochs) {
      std::printf("epoch %2d/%d  test_acc %6.2f%%  samples/s %8.0f  elapsed %6.1f s  lost_workers %u\n",
                  int(std::lround(epochs)), o.epochs, 100.0 * accuracy,
                  progress() * double(steps * global_batch) / elapsed, elapsed, strategy.aggregation().lost_workers());
      std::printf("          rank 0: %s\n", gradwire::observe::to_string(epoch_stats).c_str());
      epoch_stats = {};
    }
    std::fflush(stdout);
    out.record(epochs, accuracy, elapsed, o.target_accuracy);
  };
  for (;;) {
    const bool finished = mode::on_arrival ? strategy.aggregation().applied() >= total * workers
                                           : strategy.aggregation().version() >= total;
    if (rank == 0 && (finished || int(progress() * per_epoch) > evaluated_epochs)) evaluate(++evaluated_epochs);
    if (finished) break;
    const std::size_t step = my_steps % steps;
    if (step == 0) {  // a new pass of this worker's: the epoch's shared permutation
      std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ULL + my_steps / steps + 1);
      std::shuffle(order.begin(), order.end(), rng);
    }
    const auto step_start = steady::now();
    load_batch(data, order, step * global_batch + static_cast<std::size_t>(rank) * batch, x, y);
    model.loss_and_gradient(x, y);
    gradwire::simulation::compute(o.step_compute);
    if (straggling) std::this_thread::sleep_for((steady::now() - step_start) * (o.straggler_factor - 1));
    strategy.step(gradients);
    epoch_stats += strategy.last_step_stats();
    ++my_steps;
  }
}

template <class Optimizer>
summary train(const options& o, const Optimizer& optimizer, const fashion_mnist::fashion_mnist_data<float>& data) {
  using view = gradwire::tensor_view<float>;
  namespace aggregation = gradwire::aggregation;
  summary out;
  // One replica on whatever transport joined it (a thread's inproc endpoint or this
  // process's TCP connections): the strategy's constructor makes the replicas' parameters
  // equal, so each builds its own model. One training loop for every strategy.
  auto replica = [&]<class Transport>(Transport transport) {
    model_type model({}, o.seed);
    if (o.strategy == "parameter_server") {
      gradwire::ps::options ps;
      ps.servers = o.servers;
      int workers = o.replicas;
#if GRADWIRE_HAS_ASIO
      if (uses_tcp(o)) {
        const auto spec = gradwire::cluster::detect();
        ps.servers = spec.count(gradwire::cluster::task_type::ps);
        workers = spec.world_size - ps.servers;
      }
#endif
      ps.checkpoint_dir = o.checkpoint_dir;
      ps.checkpoint_every = o.checkpoint_every;
      // The servers own the optimizer, so they run the schedule, over the servers' progress
      // in steps (sync modes: versions; async: gradients applied / workers).
      if (o.schedule == "cosine") {
        const double lr = *o.lr;
        ps.learning_rate = [lr, &o, &data, workers = double(workers)](std::uint64_t version, std::uint64_t applied) {
          const double steps_per_epoch = std::floor(double(data.train.size()) / (double(o.batch) * workers));
          const double total = steps_per_epoch * o.epochs;
          const double step = o.ps_mode == "async" || o.ps_mode.starts_with("bounded") ? double(applied) / workers
                                                                                     : double(version);
          constexpr double pi = 3.14159265358979323846;
          return lr * 0.5 * (1.0 + std::cos(pi * std::min(1.0, step / total)));
        };
      }
      auto run = [&]<class Mode>(Mode) {
        gradwire::parameter_server<view, Optimizer, Mode, Transport> strategy(
            std::move(transport), model.parameter_views(), optimizer, aggregation::parameter_server<Mode>(ps));
        train_ps_replica(strategy, model, data, o, out);
      };
      namespace ps_mode = gradwire::ps;
      if (o.ps_mode == "async") run(ps_mode::async{});
      else if (o.ps_mode == "bounded:1") run(ps_mode::bounded_staleness<1>{});
      else if (o.ps_mode == "bounded:2") run(ps_mode::bounded_staleness<2>{});
      else if (o.ps_mode == "bounded:4") run(ps_mode::bounded_staleness<4>{});
      else if (o.ps_mode == "backup:1") run(ps_mode::backup_workers<1>{});
      else if (o.ps_mode == "backup:2") run(ps_mode::backup_workers<2>{});
      else if (o.ps_mode == "backup:4") run(ps_mode::backup_workers<4>{});
      else if (o.ps_mode == "backup:8") run(ps_mode::backup_workers<8>{});
      else run(ps_mode::sync{});
    } else if (o.strategy == "central_storage") {
      gradwire::central_storage<view, Optimizer, Transport> strategy(
          std::move(transport), model.parameter_views(), optimizer, aggregation::central(*o.owner));
      train_replica(strategy, model, data, o, out);
    } else if (o.strategy == "local_sgd") {
      gradwire::local_sgd<view, Optimizer, aggregation::dynamic_period, Transport> strategy(
          std::move(transport), model.parameter_views(), optimizer,
          aggregation::averaging<aggregation::dynamic_period>(*o.period));
      train_replica(strategy, model, data, o, out);
    } else {
      // mirrored over inproc, multi_worker_mirrored over asio_tcp.
      gradwire::strategy<view, Optimizer, aggregation::all_reduce, Transport> strategy(
          std::move(transport), model.parameter_views(), optimizer);
      train_replica(strategy, model, data, o, out);
    }
  };
  if (o.strategy == "one_device") {
    model_type model({}, o.seed);
    gradwire::one_device<view, Optimizer> strategy(model.parameter_views(), optimizer);
    train_replica(strategy, model, data, o, out);
  } else if (uses_tcp(o)) {
#if GRADWIRE_HAS_ASIO
    // One replica per process: join the job the launcher describes (rank, world size,
    // rendezvous address and token from its environment).
    if (o.transport == "ucx") {
#if GRADWIRE_HAS_UCX
      replica(gradwire::cluster::join_ucx());
#else
      throw usage_error("--transport ucx: this build has no UCX (gradwire::ucx; Debian: libucx-dev)");
#endif
    } else {
      replica(gradwire::cluster::join_tcp());
    }
#else
    throw std::logic_error("--transport tcp in a build without gradwire::asio");  // process_rank() said so
#endif
  } else if (o.transport == "simulated") {
    auto cluster = gradwire::simulation::parse_cluster_model(o.cluster);
    const int ranks = o.replicas + o.servers;
    if (cluster.size() == 1 && ranks > 1) cluster.hosts = ranks;  // no layout given: a host per rank
    if (cluster.size() != ranks)
      throw usage_error("--cluster describes " + std::to_string(cluster.size()) + " ranks (hosts x ranks_per_host) "
                        "but the job has " + std::to_string(ranks) + " (replicas + servers)");
    std::printf("simulated cluster: %s\n", gradwire::simulation::describe(cluster).c_str());
    const auto report = gradwire::simulation::run(
        cluster, [&](gradwire::transport::simulated endpoint) { replica(std::move(endpoint)); });
    std::printf("simulated %.3f s of virtual time\n", double(report.end.count()) / 1e9);
  } else {
    gradwire::transport::run_inproc(o.replicas + o.servers,
                                    [&](gradwire::transport::inproc endpoint) { replica(std::move(endpoint)); });
  }
  return out;
}

// --device cuda: the model's initial parameters (the host model's, from the same seed) and
// the data set handed to train_cuda.cu, which sees no Eigen.
summary train_on_gpu(const options& o, const fashion_mnist::fashion_mnist_data<float>& data) {
  fashion_mnist::cuda_run run;
  run.strategy = o.strategy;
  run.optimizer = o.optimizer;
  run.replicas = o.replicas;
  run.owner = o.owner.value_or(0);
  run.epochs = o.epochs;
  run.batch = o.batch;
  run.lr = *o.lr;
  run.cosine = o.schedule == "cosine";
  run.seed = o.seed;
  run.target_accuracy = o.target_accuracy;
  run.pixels = static_cast<std::size_t>(data.train.images.rows());
  run.train_count = data.train.size();
  run.test_count = data.test.size();
  run.train_images = data.train.images.data();
  run.train_labels = data.train.labels.data();
  run.test_images = data.test.images.data();
  run.test_labels = data.test.labels.data();
  model_type model({}, o.seed);
  for (const auto& p : model.parameter_views()) {
    run.initial.emplace_back(p.data(), p.data() + p.size());
    run.rows.push_back(p.shape()[0]);
    run.cols.push_back(p.shape().rank() > 1 ? p.shape()[1] : 1);
  }
  if (uses_tcp(o)) {  // one replica per process: the transport is built here and handed over erased
#if GRADWIRE_HAS_ASIO
    run.local_rank = gradwire::cluster::detect().local_rank;
    run.join = [&o]() -> gradwire::transport::any_transport {
      if (o.transport == "ucx") {
#if GRADWIRE_HAS_UCX
        return gradwire::cluster::join_ucx();
#else
        throw usage_error("--transport ucx: this build has no UCX (gradwire::ucx; Debian: libucx-dev)");
#endif
      }
      return gradwire::cluster::join_tcp();
    };
#endif
  }
  summary out;
#if GRADWIRE_HAS_CUDA
  const auto r = fashion_mnist::train_on_cuda(run);
  out.chief = r.chief;
  out.final_accuracy = r.final_accuracy;
  out.total_seconds = r.total_seconds;
  out.epoch_reached = r.epoch_reached;
  out.seconds_reached = r.seconds_reached;
#endif
  return out;
}

summary train(const options& o, const fashion_mnist::fashion_mnist_data<float>& data) {
  if (o.device == "cuda") return train_on_gpu(o, data);
  namespace optim = gradwire::optim;
  const double lr = *o.lr;
  if (o.optimizer == "sgd") return train(o, optim::sgd({.lr = lr}), data);
  if (o.optimizer == "momentum") return train(o, optim::momentum({.lr = lr, .momentum = 0.9}), data);
  if (o.optimizer == "adamw") {
    optim::adamw::options settings;
    settings.lr = lr;
    return train(o, optim::adamw(settings), data);
  }
  optim::adam::options settings;
  settings.lr = lr;
  return train(o, optim::adam(settings), data);
}

// This process's rank: over tcp it comes from the launcher's environment (and --replicas,
// --owner and --straggler are checked against the world size) before the data is loaded,
// so only rank 0 prints and a bad launch fails at once. Threads run in one process.
int process_rank(const options& o) {
  if (!uses_tcp(o)) return 0;
#if GRADWIRE_HAS_ASIO
  const auto spec = gradwire::cluster::detect();
  const std::string n = std::to_string(spec.world_size);
  const std::string world = " this job's " + n + " process(es) (from " + spec.source + ")";
  if (o.replicas != 0 && o.replicas != spec.world_size && o.strategy != "parameter_server")
    throw usage_error("--replicas " + std::to_string(o.replicas) + " does not match" + world + ": --strategy " +
                      o.strategy + " over tcp runs one replica per process, so leave --replicas out or start " +
                      std::to_string(o.replicas) + " processes (scripts/gradwire-run -n " +
                      std::to_string(o.replicas) + ", mpirun -np " + std::to_string(o.replicas) + ")");
  if (o.strategy == "parameter_server") {
    const int servers = spec.count(gradwire::cluster::task_type::ps);
    if (servers == 0 || servers >= spec.world_size)
      throw usage_error("--strategy parameter_server over tcp needs server ranks and worker ranks: start it with "
                        "scripts/gradwire-run -n WORKERS --ps SERVERS (or a TF_CONFIG with a \"ps\" list); this job "
                        "has " + std::to_string(servers) + " server(s) in " + n + " process(es)");
    if (o.straggler_rank >= spec.world_size - servers)
      throw usage_error("--straggler rank " + std::to_string(o.straggler_rank) + " is not a worker");
  }
  if (o.owner && *o.owner >= spec.world_size)
    throw usage_error("--owner " + std::to_string(*o.owner) + " is not a rank of" + world);
  if (o.straggler_rank >= spec.world_size)
    throw usage_error("--straggler rank " + std::to_string(o.straggler_rank) + " is not a rank of" + world);
  return spec.rank;
#else
  throw std::runtime_error("--strategy " + o.strategy +
                           " over tcp: this build of fashion_mnist lacks gradwire::asio (Boost.Asio and "
                           "nlohmann-json were not found when it was configured); install libboost-dev "
                           "nlohmann-json3-dev and reconfigure");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    const int rank = process_rank(o);
    // Eigen's own threads (OpenMP builds only); one per process by default, so N
    // processes or replicas on N cores do not fight over them.
    Eigen::setNbThreads(o.threads);
    const auto load_start = steady::now();
    const auto data = fashion_mnist::load_fashion_mnist<float>(o.data, o.standardise);
    if (rank == 0) {
      std::printf("loaded Fashion-MNIST from %s: %zu train, %zu test images in %.1f s\n", o.data.c_str(),
                  data.train.size(), data.test.size(),
                  std::chrono::duration<double>(steady::now() - load_start).count());
      std::fflush(stdout);
    }

    const summary s = train(o, data);
    if (!s.chief) return 0;
    std::printf("final test accuracy %.2f%% after %d epochs, %.1f s of training\n", 100.0 * s.final_accuracy,
                o.epochs, s.total_seconds);
    if (s.epoch_reached)
      std::printf("reached %g%% test accuracy at epoch %.2f, %.3f s\n", 100.0 * o.target_accuracy, s.epoch_reached,
                  s.seconds_reached);
    else
      std::printf("did not reach %g%% test accuracy in %d epochs\n", 100.0 * o.target_accuracy, o.epochs);
    return 0;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n\n%s", e.what(), usage_text);
    return 2;
  } catch (const gradwire::error& e) {
    std::fprintf(stderr, "fashion_mnist: gradwire error (%s): %s\n", e.code().message().c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
