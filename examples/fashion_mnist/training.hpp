// What main.cpp and the trainer translation units share: the options, the summary, and one
// plain function per strategy family and transport, so that no translation unit compiles them all.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "idx.hpp"

namespace fashion_mnist {

using data_set = fashion_mnist_data<float>;

// A bad command line: main prints the message and the usage, and exits 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string strategy = "one_device";
  std::string device = "cpu";
  std::string transport;  // inproc or tcp; empty until parse() picks the strategy's default
  int replicas = 0;       // 0: the strategy's default
  std::optional<int> owner;   // central_storage only
  std::optional<int> period;  // local_sgd and diloco only
  // diloco only (parse() sets the defaults: 0.7, 0.9, 1, 0)
  std::optional<double> outer_lr, outer_momentum;
  std::optional<int> fragments, delay;
  std::string compress = "none";  // mirrored / multi_worker_mirrored: the gradients' codec (plan::parse_codec)
  int backup_workers = 0;     // mirrored / multi_worker_mirrored: K of N
  int min_replicas = 0;       // multi_worker_mirrored: > 0 for the elastic all-reduce (shrinks past a loss)
  int epochs = 10;
  int batch = 64;
  std::optional<double> lr;
  std::string optimizer = "adam";
  std::string data = default_data_dir;
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
inline bool uses_tcp(const options& o) { return o.transport == "tcp" || o.transport == "ucx"; }

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

// The trainers, one translation unit each (train_<family>_<transport>.cpp). Each runs every
// optimizer of its strategy family (parameter_server's: of a group of --ps-mode values); the
// tcp and ucx ones exist in builds with that transport.
using trainer = summary (*)(const options&, const data_set&);

summary train_one_device(const options&, const data_set&);
summary train_all_reduce_inproc(const options&, const data_set&);  // mirrored
summary train_all_reduce_simulated(const options&, const data_set&);
summary train_all_reduce_tcp(const options&, const data_set&);     // multi_worker_mirrored
summary train_all_reduce_ucx(const options&, const data_set&);
summary train_elastic_tcp(const options&, const data_set&);  // multi_worker_mirrored --min-replicas M
summary train_elastic_ucx(const options&, const data_set&);
summary train_elastic_simulated(const options&, const data_set&);
summary train_central_inproc(const options&, const data_set&);     // central_storage
summary train_central_simulated(const options&, const data_set&);
summary train_central_tcp(const options&, const data_set&);
summary train_central_ucx(const options&, const data_set&);
summary train_local_sgd_inproc(const options&, const data_set&);
summary train_local_sgd_simulated(const options&, const data_set&);
summary train_local_sgd_tcp(const options&, const data_set&);
summary train_local_sgd_ucx(const options&, const data_set&);
summary train_diloco_inproc(const options&, const data_set&);
summary train_diloco_tcp(const options&, const data_set&);
summary train_diloco_simulated(const options&, const data_set&);
summary train_sharded_inproc(const options&, const data_set&);  // sharded (ZeRO-1)
summary train_sharded_simulated(const options&, const data_set&);
summary train_sharded_tcp(const options&, const data_set&);
summary train_compressed_inproc(const options&, const data_set&);  // mirrored --compress CODEC
summary train_compressed_simulated(const options&, const data_set&);
summary train_compressed_tcp(const options&, const data_set&);  // multi_worker_mirrored --compress CODEC
summary train_ps_sync_inproc(const options&, const data_set&);  // parameter_server, by --ps-mode
summary train_ps_sync_simulated(const options&, const data_set&);
summary train_ps_sync_tcp(const options&, const data_set&);
summary train_ps_sync_ucx(const options&, const data_set&);
summary train_ps_bounded_inproc(const options&, const data_set&);
summary train_ps_bounded_simulated(const options&, const data_set&);
summary train_ps_bounded_tcp(const options&, const data_set&);
summary train_ps_bounded_ucx(const options&, const data_set&);
summary train_ps_backup_inproc(const options&, const data_set&);
summary train_ps_backup_simulated(const options&, const data_set&);
summary train_ps_backup_tcp(const options&, const data_set&);
summary train_ps_backup_ucx(const options&, const data_set&);
summary train_ps_many_backup_inproc(const options&, const data_set&);
summary train_ps_many_backup_simulated(const options&, const data_set&);
summary train_ps_many_backup_tcp(const options&, const data_set&);
summary train_ps_many_backup_ucx(const options&, const data_set&);
summary train_ps_compressed_inproc(const options&, const data_set&);  // parameter_server --compress CODEC
summary train_ps_compressed_simulated(const options&, const data_set&);
summary train_ps_compressed_tcp(const options&, const data_set&);
summary train_ps_compressed_ucx(const options&, const data_set&);

// --device cuda (train_on_gpu.cpp, in builds with gradwire::cuda).
summary train_on_gpu(const options& o, const data_set& data);

// The trainer of o.device, o.strategy and o.transport (trainers.cpp: fashion_mnist has every
// one its build allows; trainers_mirrored.cpp: fashion_mnist_mirrored, the demo's one).
trainer find_trainer(const options& o);

}  // namespace fashion_mnist
