// Trains a 784-256-128-10 MLP on Fashion-MNIST with gradwire's one_device, mirrored,
// multi_worker_mirrored, central_storage, local_sgd, diloco, sharded or parameter_server strategy.
//
//   fashion_mnist [--strategy one_device|mirrored|multi_worker_mirrored|central_storage|local_sgd|diloco|sharded|
//                             parameter_server] [--compress none|fp16|bf16|int8|topk:F|powersgd:R]
//                 [--transport inproc|tcp|ucx|simulated] [--replicas N] [--owner R] [--period H] [--backup-workers B]
//                 [--outer-lr X] [--outer-momentum M] [--fragments F] [--delay D]
//                 [--min-replicas M]
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
// time on the cluster --cluster describes (gradwire/transport/simulated/), and every time printed
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <gradwire/aggregation/min_replicas.hpp>
#include <gradwire/error.hpp>
#include <gradwire/plan/codec_model.hpp>
#if GRADWIRE_HAS_ASIO
#include <gradwire/cluster/spec.hpp>
#endif

#include "eigen.hpp"
#include "idx.hpp"
#include "training.hpp"

namespace {

using fashion_mnist::options;
using fashion_mnist::summary;
using fashion_mnist::usage_error;
using fashion_mnist::uses_tcp;
using steady = std::chrono::steady_clock;  // before any rank runs: real time

constexpr const char* usage_text =
    "usage: fashion_mnist [options]\n"
    "  --strategy one_device|mirrored|multi_worker_mirrored|central_storage|local_sgd|diloco|sharded|parameter_server\n"
    "                                   training strategy (default one_device); multi_worker_mirrored runs one\n"
    "                                   replica per process: start it with scripts/gradwire-run -n N, mpirun -np N,\n"
    "                                   srun or TF_CONFIG\n"
    "  --transport inproc|tcp|ucx       central_storage, local_sgd, diloco, sharded: replicas as threads of this\n"
    "                                   process\n"
    "                                   (inproc, the default) or one per process under a launcher (tcp, as\n"
    "                                   multi_worker_mirrored, or ucx: UCX, with UCX_TLS choosing shared memory,\n"
    "                                   TCP or RDMA; diloco and sharded: not ucx); mirrored is inproc,\n"
    "                                   multi_worker_mirrored tcp or ucx; simulated (any strategy but\n"
    "                                   one_device): replicas and servers as threads in virtual time on the\n"
    "                                   cluster --cluster describes; times are virtual\n"
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
    "  --period H                       local_sgd: average the parameters every H local steps; diloco: an outer\n"
    "                                   step every H local steps (default 8)\n"
    "  --outer-lr X                     diloco: the outer Nesterov step's learning rate (default 0.7)\n"
    "  --outer-momentum M               diloco: the outer step's momentum, in [0, 1) (default 0.9)\n"
    "  --fragments F                    diloco: stream the synchronisation in F fragments at staggered steps\n"
    "                                   (default 1: the whole model every H steps)\n"
    "  --delay D                        diloco: a fragment's outer update lands D steps after its all-reduce\n"
    "                                   starts, which runs meanwhile (default 0; 0 <= D < H; docs/strategies/diloco.md)\n"
    "  --compress CODEC                 mirrored / multi_worker_mirrored: all-reduce compressed gradients: none\n"
    "                                   (default), fp16, bf16, int8, topk:FRACTION (with error feedback) or\n"
    "                                   powersgd:RANK (plain for its first 10 steps; docs/strategies/compression.md);\n"
    "                                   diloco: its pseudo-gradients in fp16, bf16 or int8; parameter_server\n"
    "                                   (--ps-mode sync or async): the workers' pushes through any of the five\n"
    "                                   (PowerSGD from the first push; pulls stay float)\n"
    "  --backup-workers B               mirrored / multi_worker_mirrored: K of N, a step closes when all but B\n"
    "                                   replicas have their gradients in; the late ones' are dropped (default 0;\n"
    "                                   docs/elastic.md)\n"
    "  --min-replicas M                 multi_worker_mirrored (or mirrored over simulated): elastic, the job\n"
    "                                   shrinks past a lost replica and goes on while M remain (and a majority of\n"
    "                                   the ranks before the loss); each epoch's samples are re-partitioned so\n"
    "                                   none is lost or read twice. GRADWIRE_MIN_REPLICAS=M does the same for a\n"
    "                                   launcher-started job (docs/elastic.md)\n"
    "  --ps S                           parameter_server over inproc: S of the threads serve (default 1); over tcp\n"
    "                                   the launcher says: scripts/gradwire-run -n N --ps S, TF_CONFIG's ps, or\n"
    "                                   under srun or mpirun GRADWIRE_NUM_PS=S on every rank (the last S ranks serve)\n"
    "  --ps-mode M                      parameter_server: sync (default), async, bounded:S (S in 1, 2, 4) or\n"
    "                                   backup:B (B in 1, 2, 4, 8); the servers run the lr schedule\n"
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
          o.strategy != "central_storage" && o.strategy != "local_sgd" && o.strategy != "diloco" &&
          o.strategy != "sharded" && o.strategy != "parameter_server")
        throw usage_error(
            "--strategy must be one_device, mirrored, multi_worker_mirrored, central_storage, local_sgd, diloco, "
            "sharded or parameter_server, got '" +
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
    } else if (flag == "--outer-lr") {
      o.outer_lr = parse_positive(flag, next());
    } else if (flag == "--outer-momentum") {
      const std::string_view text = next();
      double value = -1;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || !(value >= 0 && value < 1))
        throw usage_error("--outer-momentum expects a number in [0, 1), got '" + std::string(text) + "'");
      o.outer_momentum = value;
    } else if (flag == "--fragments") {
      o.fragments = parse_int<int>(flag, next(), 1);
    } else if (flag == "--delay") {
      o.delay = parse_int<int>(flag, next(), 0);
    } else if (flag == "--compress") {
      o.compress = next();
      try {
        (void)gradwire::plan::parse_codec(o.compress);  // the planner's spelling, one rule for both
      } catch (const gradwire::error& e) {
        throw usage_error(e.details());
      }
    } else if (flag == "--backup-workers") {
      o.backup_workers = parse_int<int>(flag, next(), 0);
    } else if (flag == "--min-replicas") {
      o.min_replicas = parse_int<int>(flag, next(), 1);
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
#if FASHION_MNIST_MIRRORED_ONLY
  if (o.strategy != "mirrored" || (!o.transport.empty() && o.transport != "inproc") || o.device != "cpu")
    throw usage_error("fashion_mnist_mirrored (scripts/demo's quick build) trains --strategy mirrored on the cpu "
                      "alone: build fashion_mnist for the others (cmake --build BUILD_DIR --target fashion_mnist)");
#endif
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
  if (o.period && o.strategy != "local_sgd" && o.strategy != "diloco")
    throw usage_error("--period is for --strategy local_sgd or diloco, not " + o.strategy);
  for (const auto& [given, flag] : {std::pair{o.outer_lr.has_value(), "--outer-lr"},
                                    std::pair{o.outer_momentum.has_value(), "--outer-momentum"},
                                    std::pair{o.fragments.has_value(), "--fragments"},
                                    std::pair{o.delay.has_value(), "--delay"}})
    if (given && o.strategy != "diloco")
      throw usage_error(std::string(flag) + " is for --strategy diloco, not " + o.strategy);
  if (o.compress != "none" && o.strategy == "diloco") {
    if (o.compress != "fp16" && o.compress != "bf16" && o.compress != "int8")
      throw usage_error("--strategy diloco takes --compress fp16, bf16 or int8 for its pseudo-gradients, not " +
                        o.compress);
  } else if (o.compress != "none" && o.strategy == "parameter_server") {
    if (o.ps_mode != "sync" && o.ps_mode != "async")
      throw usage_error("--compress with --strategy parameter_server takes --ps-mode sync or async in this example, "
                        "not " + o.ps_mode + " (each mode and codec is a strategy to compile, and the example builds "
                        "these two; the library takes every mode: aggregation::parameter_server<Mode>::compress)");
    if (o.device == "cuda")
      throw usage_error("--compress with --strategy parameter_server does not combine with --device cuda yet");
  } else if (o.compress != "none") {
    if (o.strategy != "mirrored" && o.strategy != "multi_worker_mirrored")
      throw usage_error("--compress is for --strategy mirrored or multi_worker_mirrored (all-reduce of compressed "
                        "gradients), diloco (its pseudo-gradients) or parameter_server (the workers' pushes), not " +
                        o.strategy);
    if (o.backup_workers > 0 || o.min_replicas > 0 || o.device == "cuda" || o.transport == "ucx")
      throw usage_error("--compress does not combine with --backup-workers, --min-replicas, --device cuda or "
                        "--transport ucx yet");
  }
  if (o.backup_workers > 0 && o.strategy != "mirrored" && o.strategy != "multi_worker_mirrored")
    throw usage_error("--backup-workers is for --strategy mirrored or multi_worker_mirrored (parameter_server has "
                      "its own: --ps-mode backup), not " + o.strategy);
  // GRADWIRE_MIN_REPLICAS: how a launcher-started job asks for the elastic all-reduce; a
  // strategy that cannot shrink refuses it rather than fail at the first loss.
  if (o.min_replicas == 0) o.min_replicas = gradwire::aggregation::min_replicas_from_environment(0);
  if (o.min_replicas > 0) {
    if (o.strategy != "multi_worker_mirrored" && !(o.strategy == "mirrored" && o.transport == "simulated"))
      throw usage_error("--min-replicas is for --strategy multi_worker_mirrored (or mirrored over --transport "
                        "simulated): the elastic all-reduce needs replicas that can be lost one by one, not " +
                        o.strategy + " over " + o.transport);
    if (o.backup_workers > 0)
      throw usage_error("--min-replicas and --backup-workers do not combine yet (docs/elastic.md)");
    if (!o.checkpoint_dir.empty() || o.evals_per_epoch > 1 || o.device == "cuda")
      throw usage_error("--min-replicas does not take --checkpoint-dir, --evals-per-epoch or --device cuda yet");
  }
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
      throw usage_error("--ps S is for threads; over tcp the launcher says (scripts/gradwire-run -n N --ps S, or "
                        "GRADWIRE_NUM_PS=S on every rank under srun or mpirun)");
    if (!uses_tcp(o) && !o.servers) o.servers = 1;
  }
  if (o.strategy == "central_storage" && !o.owner) o.owner = 0;
  if ((o.strategy == "local_sgd" || o.strategy == "diloco") && !o.period) o.period = 8;
  if (o.strategy == "sharded" && o.transport == "ucx")
    throw usage_error("--strategy sharded runs over --transport inproc, tcp or simulated in this example (not ucx yet)");
  if (o.strategy == "diloco") {
    if (o.transport == "ucx")
      throw usage_error("--strategy diloco runs over --transport inproc, tcp or simulated in this example (not ucx "
                        "yet)");
    if (!o.checkpoint_dir.empty())
      throw usage_error("--strategy diloco does not take --checkpoint-dir yet (its anchor and outer momentum are not "
                        "in a checkpoint)");
    if (!o.outer_lr) o.outer_lr = 0.7;
    if (!o.outer_momentum) o.outer_momentum = 0.9;
    if (!o.fragments) o.fragments = 1;
    if (!o.delay) o.delay = 0;
    if (*o.delay >= *o.period)
      throw usage_error("--delay " + std::to_string(*o.delay) + " must be below --period " + std::to_string(*o.period) +
                        ": a fragment's outer update must land before its next all-reduce starts");
  }
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
    if (o.backup_workers >= o.replicas)
      throw usage_error("--backup-workers " + std::to_string(o.backup_workers) + " leaves no replica of " +
                        std::to_string(o.replicas) + " in a step: it must be below the replica count");
    if (o.min_replicas > o.replicas)
      throw usage_error("--min-replicas " + std::to_string(o.min_replicas) + " is more than the " +
                        std::to_string(o.replicas) + " replica(s) of the job");
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

// The trainer of this strategy and transport (compiled in its own translation unit).
summary train(const options& o, const fashion_mnist::data_set& data) {
#if !GRADWIRE_HAS_UCX
  if (o.transport == "ucx")
    throw usage_error("--transport ucx: this build has no UCX (gradwire::ucx; Debian: libucx-dev)");
#endif
  return fashion_mnist::find_trainer(o)(o, data);
}

// Started by a launcher as N processes, a strategy that runs in one process would train N
// models of their own and print N results: a usage error, naming the strategies that span processes.
void refuse_a_multi_process_launch(const options& o) {
#if GRADWIRE_HAS_ASIO
  gradwire::cluster::cluster_spec spec;
  try {
    spec = gradwire::cluster::detect();
  } catch (const gradwire::error&) {
    // Variables that describe no job this process belongs to (half set, or a Slurm batch
    // script's own process, outside srun): it does not need them.
    return;
  }
  if (spec.world_size <= 1) return;
  throw usage_error("--strategy " + o.strategy +
                    (o.strategy == "one_device" ? " trains in this process alone"
                                                : " runs its replicas as threads of this process") +
                    ", but this is rank " + std::to_string(spec.rank) + " of a job of " +
                    std::to_string(spec.world_size) + " processes (from " + spec.source +
                    "), so each process would train a model of its own: use --strategy multi_worker_mirrored (or "
                    "--transport tcp with central_storage, local_sgd, diloco or parameter_server) to train one model "
                    "across the processes, or start one process");
#else
  (void)o;  // without gradwire::asio no launcher is read (nor joined)
#endif
}

// This process's rank: over tcp it comes from the launcher's environment (and --replicas,
// --owner and --straggler are checked against the world size) before the data is loaded,
// so only rank 0 prints and a bad launch fails at once. Threads run in one process.
int process_rank(const options& o) {
  if (!uses_tcp(o)) {
    refuse_a_multi_process_launch(o);
    return 0;
  }
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
                        "scripts/gradwire-run -n WORKERS --ps SERVERS (or a TF_CONFIG with a \"ps\" list; under "
                        "srun or mpirun set GRADWIRE_NUM_PS=SERVERS on every rank, and the last SERVERS ranks serve); "
                        "this job has " + std::to_string(servers) + " server(s) in " + n + " process(es)");
    if (o.straggler_rank >= spec.world_size - servers)
      throw usage_error("--straggler rank " + std::to_string(o.straggler_rank) + " is not a worker");
  }
  if (o.owner && *o.owner >= spec.world_size)
    throw usage_error("--owner " + std::to_string(*o.owner) + " is not a rank of" + world);
  if (o.straggler_rank >= spec.world_size)
    throw usage_error("--straggler rank " + std::to_string(o.straggler_rank) + " is not a rank of" + world);
  if (o.backup_workers >= spec.world_size)
    throw usage_error("--backup-workers " + std::to_string(o.backup_workers) + " leaves no replica of" + world +
                      " in a step: it must be below the process count");
  if (o.min_replicas > spec.world_size)
    throw usage_error("--min-replicas " + std::to_string(o.min_replicas) + " is more than the replicas of" + world);
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
