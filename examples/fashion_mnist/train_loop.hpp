// The training loop every trainer translation unit shares, the optimizer, and the launches
// that start a run's replicas (threads and simulated ranks here; processes in one_per_process.hpp).
// A trainer TU runs one strategy family (family_*.hpp) on one launch, e.g.
//   summary train_central_inproc(const options& o, const data_set& d) { return train<central>(o, d, on_threads{}); }
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradwire/checkpoint.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/instances/inproc.hpp>  // the collectives over inproc come compiled, from the runtime
#include <gradwire/observe/step_stats.hpp>
#include <gradwire/optim/adam.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/one_of.hpp>
#include <gradwire/optim/sgd.hpp>
#include <gradwire/strategy.hpp>
#include <gradwire/support/fnv1a.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#include <gradwire/transport/inproc.hpp>
#include <gradwire/transport/simulated.hpp>

#include "idx.hpp"
#include "mlp.hpp"
#include "training.hpp"

namespace fashion_mnist {

// The model's Eigen products (its forward and backward passes) are compiled once, in mlp.cpp,
// not in every trainer.
extern template class mlp<float>;

using steady = gradwire::clock;
using model_type = mlp<float>;
using matrix = model_type::matrix;

// This replica's batch: samples order[first .. first + y.size()) into x's columns and y.
inline void load_batch(const data_set& data, std::span<const std::size_t> order, std::size_t first, matrix& x,
                       std::vector<int>& y) {
  for (std::size_t j = 0; j < y.size(); ++j) {
    const std::size_t sample = order[first + j];
    x.col(static_cast<Eigen::Index>(j)) = data.train.images.col(static_cast<Eigen::Index>(sample));
    y[j] = data.train.labels[sample];
  }
}

// One line per rank at the end of a run, which scripts compare: the replicas of a
// synchronous strategy end bit-identical, so their hashes are equal. FNV-1a (64 bits) over
// the parameters' bytes, tensor after tensor in the model's order.
inline void print_parameter_hash(int rank, model_type& model) {
  gradwire::support::fnv1a hash;
  for (const auto& p : model.parameter_views()) hash.add(std::as_bytes(std::span<const float>(p.data(), p.size())));
  std::printf("rank %d: final parameters fnv1a %016llx\n", rank, static_cast<unsigned long long>(hash.value()));
  std::fflush(stdout);
}

// local_sgd's replicas differ between averaging points; evaluation needs their average
// (family_local_sgd.hpp and family_diloco.hpp say which aggregations average).
template <class Aggregation>
inline constexpr bool averages_parameters = false;

// Replicas whose optimizer states differ (sharded: each its shard) save and load a file each.
template <class Aggregation>
inline constexpr bool checkpoints_per_rank = false;

// Streaming DiLoCo with a delay runs its all-reduces on the communicator's thread across
// steps: the loop's own collectives (evaluation, an epoch's stats) wait for them first.
template <class Strategy>
void wait_in_flight(Strategy& strategy) {
  if constexpr (requires { strategy.aggregation().wait_in_flight(strategy.communicator()); })
    strategy.aggregation().wait_in_flight(strategy.communicator());
}

// One replica's training loop, the same for every strategy. All replicas see the same
// permutation per epoch and take their own B-sample slice of each global batch.
template <class Strategy>
void train_replica(Strategy& strategy, model_type& model, const data_set& data, const options& o, summary& out) {
  const int rank = strategy.rank(), replicas = strategy.size();
  const gradwire::time_source time = strategy.time();  // virtual on a simulated rank, as the step stats are
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
    if (o.outer_lr) {  // diloco
      char outer[160];
      std::snprintf(outer, sizeof outer, " (period %d, outer Nesterov lr %g momentum %g, fragments %d, delay %d)",
                    *o.period, *o.outer_lr, *o.outer_momentum, *o.fragments, *o.delay);
      detail = outer;
    }
    if (o.compress != "none") detail += " (compress " + o.compress + ")";
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
  constexpr bool own_checkpoints = averaging || checkpoints_per_rank<typename Strategy::aggregation_type>;
  std::optional<model_type> averaged;
  std::vector<float> flat;
  if constexpr (averaging) flat.resize(model.parameter_count());

  // Cosine decay from lr to 0 over the run, set per step: the last epochs average out
  // the noise of the step, so the final accuracy does not depend on where it stopped.
  const std::size_t total_steps = steps * static_cast<std::size_t>(o.epochs);
  auto cosine = [lr = *o.lr, total_steps](std::uint64_t global_step) {
    constexpr double pi = 3.14159265358979323846;
    return lr * 0.5 * (1.0 + std::cos(pi * double(global_step) / double(total_steps)));
  };
  auto set_lr = [&](std::size_t global_step) {
    if (o.schedule != "cosine" || o.backup_workers > 0) return;
    strategy.optimizer().set_lr(cosine(global_step));
  };

  // Checkpoints: replicas of every strategy but local_sgd hold the same parameters, so one
  // rank saves one file that every rank loads: the chief, or central_storage's owner (the
  // only rank whose optimizer state is used); local_sgd replicas each save and load their own.
  std::filesystem::path checkpoint;
  std::uint64_t resumed = 0;  // global steps already done by the run this one resumes
  if (!o.checkpoint_dir.empty()) {
    std::filesystem::create_directories(o.checkpoint_dir);
    checkpoint = std::filesystem::path(o.checkpoint_dir) /
                 (own_checkpoints ? "model-rank-" + std::to_string(rank) + ".ckpt" : std::string("model.ckpt"));
    if (std::filesystem::exists(checkpoint)) {
      resumed = gradwire::load_checkpoint(checkpoint, strategy);
      if (rank == 0)
        std::printf("resumed from %s at step %llu of %llu%s\n", checkpoint.c_str(), (unsigned long long)resumed,
                    (unsigned long long)(steps * static_cast<std::uint64_t>(o.epochs)),
                    resumed >= steps * static_cast<std::uint64_t>(o.epochs) ? ": the run is complete" : "");
    }
  }
  // K of N: a replica that was late applies the steps it missed in one finish, each at its
  // own step's rate, so the schedule goes to the strategy (counting from its construction,
  // which a resumed run's steps come after) instead of being set before each step.
  constexpr bool k_of_n = requires(Strategy& s) { s.aggregation().last_steps_advanced(); };
  if constexpr (k_of_n) {
    if (o.backup_workers > 0 && o.schedule == "cosine")
      strategy.schedule_lr([cosine, resumed](std::uint64_t s) { return cosine(resumed + s); });
  }
  auto save = [&](std::uint64_t done) {
    const int saver = o.strategy == "central_storage" ? o.owner.value_or(0) : 0;
    if (!checkpoint.empty() && (rank == saver || own_checkpoints)) gradwire::save_checkpoint(checkpoint, strategy, done);
  };

  // This replica's correct predictions on its share of the test set, after `steps_so_far`
  // global steps (collective: every replica calls it at the same step).
  auto test_correct = [&](std::size_t steps_so_far) {
    wait_in_flight(strategy);
    model_type* evaluated = &model;
    if constexpr (averaging) {
      // Every rank counts the same steps, so all agree whether the last one averaged
      // (streaming DiLoCo's replicas agree on no step: some fragment is always apart).
      const bool agree = steps_so_far % static_cast<std::size_t>(*o.period) == 0 && o.fragments.value_or(1) == 1 &&
                         o.delay.value_or(0) == 0;
      if (replicas > 1 && !agree) {
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

  const auto start = time.now();
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    // Same seed on every replica: the same permutation everywhere, a new one per epoch.
    std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    if (static_cast<std::uint64_t>(epoch) * steps <= resumed) continue;  // done before the restart

    const auto epoch_start = time.now();
    double loss_sum = 0;
    std::size_t steps_done = 0;  // fewer than steps in an epoch resumed from a checkpoint
    // Where a replica's step time goes: its own forward/backward vs strategy.step
    // (all-reduce, waiting for the slowest replica, optimizer).
    steady::duration compute_time{}, step_time{};
    gradwire::observe::step_stats epoch_stats;  // this replica's steps: bytes, communication vs compute
    std::uint64_t peak_sent = 0;                 // the most bytes one step sent (streaming DiLoCo spreads it)
    std::size_t planned_until = 0;  // K of N: the steps planned run up to here (this epoch's numbering)
    for (std::size_t step = 0; step < steps; ++step) {
      std::uint64_t global_step = static_cast<std::uint64_t>(epoch - 1) * steps + step;
      if (global_step < resumed) continue;
      // K of N: plan the steps up to the next point where every replica does something of
      // its own (an evaluation, a checkpoint, the epoch's end), so that a late replica's
      // communicator thread goes on through them without it.
      if constexpr (k_of_n) {
        if (o.backup_workers > 0 && step >= planned_until) {
          std::size_t end = steps;
          if (eval_every) end = std::min(end, (step / eval_every + 1) * eval_every);
          if (o.checkpoint_every)
            end = std::min<std::size_t>(end, static_cast<std::size_t>((global_step / o.checkpoint_every + 1) *
                                                                      o.checkpoint_every -
                                                                      static_cast<std::uint64_t>(epoch - 1) * steps));
          strategy.aggregation().plan_steps(end - step);
          planned_until = end;
        }
      }
      const auto step_start = time.now();
      // K of N: the step opens before the forward pass, so that this replica's close watch
      // listens while it computes, and a slow replica is left out without being waited for.
      std::optional<typename Strategy::pending_step> opened;
      if (o.backup_workers > 0) opened.emplace(strategy.begin_step());
      load_batch(data, order, step * global_batch + static_cast<std::size_t>(rank) * batch, x, y);
      loss_sum += model.loss_and_gradient(x, y);
      gradwire::simulation::compute(o.step_compute);  // modelled work: nothing unless simulated
      // A simulated slow replica: sleeping (FACTOR - 1) x its own compute time makes its
      // forward/backward take FACTOR times as long (--timing counts the sleep there).
      if (straggling)
        std::this_thread::sleep_for((time.now() - step_start) * (o.straggler_factor - 1));
      set_lr(static_cast<std::size_t>(epoch - 1) * steps + step);
      const auto computed = time.now();
      if (opened) {
        for (std::size_t i = 0; i < gradients.size(); ++i) opened->ready(i, gradients[i]);
        opened->finish();
      } else {
        strategy.step(gradients);
      }
      epoch_stats += strategy.last_step_stats();
      peak_sent = std::max(peak_sent, strategy.last_step_stats().traffic.bytes_sent);
      compute_time += computed - step_start;
      step_time += time.now() - computed;
      ++steps_done;
      // K of N: a late replica's finish may apply steps the others took while it computed;
      // its loop skips them (within the plan, so never past an evaluation or a checkpoint).
      if constexpr (k_of_n) {
        const auto skipped = static_cast<std::size_t>(strategy.aggregation().last_steps_advanced() - 1);
        step += skipped;
        global_step += skipped;
      }
      if (o.checkpoint_every && (global_step + 1) % o.checkpoint_every == 0) save(global_step + 1);
      if (eval_every && (step + 1) % eval_every == 0 && step + 1 < steps) {
        double correct = test_correct(static_cast<std::size_t>(global_step + 1));
        gradwire::collective::all_reduce(strategy.communicator(), std::span<double>(&correct, 1));
        if (rank == 0)
          out.record(double(epoch - 1) + double(step + 1) / double(steps), correct / double(n_test),
                     std::chrono::duration<double>(time.now() - start).count(), o.target_accuracy);
      }
    }
    // After the last step, the updates an aggregation still owes (streaming DiLoCo's delayed
    // fragments) land before the final evaluation and checkpoint; a no-op for the others.
    if (epoch == o.epochs) strategy.flush();
    const double train_seconds = std::chrono::duration<double>(time.now() - epoch_start).count();

    // {sum of per-step mean losses, steps, correct test predictions, compute and step
    // seconds} summed over all replicas.
    std::array<double, 5> stats{loss_sum, double(steps_done), 0.0, std::chrono::duration<double>(compute_time).count(),
                                std::chrono::duration<double>(step_time).count()};
    stats[2] = test_correct(static_cast<std::size_t>(epoch) * steps);
    gradwire::collective::all_reduce(strategy.communicator(), std::span<double>(stats));

    if (rank == 0) {
      const double elapsed = std::chrono::duration<double>(time.now() - start).count();
      const double accuracy = stats[2] / double(n_test);
      std::printf("epoch %2d/%d  train_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %6.1f s", epoch,
                  o.epochs, stats[0] / stats[1], 100.0 * accuracy,
                  double(steps_done * global_batch) / train_seconds, elapsed);
      if (o.timing)
        std::printf("  [per replica: forward/backward %.2f s, step %.2f s, of %.2f s]", stats[3] / replicas,
                    stats[4] / replicas, train_seconds);
      std::printf("\n          rank 0: %s", gradwire::observe::to_string(epoch_stats).c_str());
      if (epoch_stats.traffic_measured) std::printf(", at most %.3g MB sent in a step", double(peak_sent) / 1e6);
      std::printf("\n");
      std::fflush(stdout);
      out.record(epoch, accuracy, elapsed, o.target_accuracy);
    }
  }
  save(steps * static_cast<std::uint64_t>(o.epochs));
  // K of N: of the job's steps, how many this replica computed a gradient for (the rest it
  // skipped, catching up), and how many of those gradients came too late and were dropped.
  if (o.backup_workers > 0)
    std::printf("rank %d: K of N: computed %llu of the job's %llu steps, %llu of them dropped\n", rank,
                static_cast<unsigned long long>(strategy.cumulative_stats().steps),
                static_cast<unsigned long long>(steps * static_cast<std::uint64_t>(o.epochs) - resumed),
                static_cast<unsigned long long>(strategy.cumulative_stats().dropped));
  // What the optimizer state costs this replica (sharded: its shard), for benchmarks/efficient.sh.
  if constexpr (requires { strategy.optimizer_state_bytes(); })
    if (rank == 0) std::printf("rank 0: optimizer state %zu bytes\n", strategy.optimizer_state_bytes());
  print_parameter_hash(rank, model);
}

// The optimizer --optimizer and --lr name, chosen at run time: each trainer compiles its
// strategy once for the four (optim::one_of), not once per optimizer.
using optimizer_choice =
    gradwire::optim::one_of<gradwire::optim::sgd, gradwire::optim::momentum, gradwire::optim::adam, gradwire::optim::adamw>;

inline optimizer_choice chosen_optimizer(const options& o) {
  namespace optim = gradwire::optim;
  const double lr = *o.lr;
  if (o.optimizer == "sgd") return optim::sgd({.lr = lr});
  if (o.optimizer == "momentum") return optim::momentum({.lr = lr, .momentum = 0.9});
  if (o.optimizer == "adamw") {
    optim::adamw::options settings;
    settings.lr = lr;
    return optim::adamw(settings);
  }
  optim::adam::options settings;
  settings.lr = lr;
  return optim::adam(settings);
}

// What the replicas of one run share.
struct run_context {
  const options& o;
  const data_set& data;
  summary& out;
  int servers;  // parameter_server: how many ranks serve (the last ones)
};

// The strategy families (family_*.hpp) each build one replica on the transport a launch
// hands them: the strategy's constructor makes the replicas' parameters equal, so each
// builds its own model. What the family's strategies take as parameters and gradients:
using view = gradwire::tensor_view<float>;

// Launches: start the replicas of a run, each with its transport.

// Replicas (and servers) as threads of this process.
struct on_threads {
  int servers(const options& o) const { return o.servers; }
  template <class Replica>
  void operator()(const options& o, Replica&& replica) const {
    gradwire::transport::run_inproc(o.replicas + o.servers,
                                    [&](gradwire::transport::inproc endpoint) { replica(std::move(endpoint)); });
  }
};

// Replicas and servers as threads in virtual time on the cluster --cluster describes.
struct on_simulator {
  int servers(const options& o) const { return o.servers; }
  template <class Replica>
  void operator()(const options& o, Replica&& replica) const {
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
  }
};

// Family's replicas on the transport `launch` gives, with the optimizer the options name.
template <class Family, class Launch>
summary train(const options& o, const data_set& data, const Launch& launch) {
  const optimizer_choice optimizer = chosen_optimizer(o);
  summary out;
  const run_context run{o, data, out, launch.servers(o)};
  launch(o, [&](auto transport) { Family::replica(std::move(transport), optimizer, run); });
  return out;
}

}  // namespace fashion_mnist
