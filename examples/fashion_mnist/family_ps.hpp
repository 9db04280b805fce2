// The parameter_server family: the last ranks serve, the others push gradients and pull parameters.
#pragma once

#include <string>
#include <type_traits>

#include <gradwire/strategies/parameter_server.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// parameter_server: servers serve; workers step until the servers have done a run's worth
// of work (sync modes: epochs x steps versions; async modes: as many gradients applied as
// sync training would apply, so fast workers take on a straggler's share). Each worker
// takes its slice of every global batch, by its own step count; the chief evaluates the
// model it pulled on the whole test set each time the servers' progress crosses an epoch.
template <class Strategy>
void train_ps_replica(Strategy& strategy, model_type& model, const data_set& data, const options& o, summary& out) {
  using mode = typename Strategy::aggregation_type::mode;
  if (strategy.is_server()) {
    const auto st = strategy.serve();
    std::uint64_t pushes = 0;
    for (auto p : st.pushes) pushes += p;
    std::printf("ps rank %d: mode %s version %llu updates %llu gradients %llu applied %llu dropped %llu "
                "staleness mean %.2f p50 %llu p99 %llu max %llu update_lag mean %.2f p50 %llu p99 %llu max %llu "
                "max_lead %llu lost_workers %zu rejoined_workers %zu one_sided %llu\n",
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
                (unsigned long long)st.max_lead, st.lost_workers.size(), st.rejoined_workers.size(),
                (unsigned long long)st.one_sided);
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
    const std::string pushes = o.compress == "none" ? "" : " (compress " + o.compress + ")";  // the pushes
    std::printf("strategy parameter_server (%s)%s over %s, %d workers + %d servers, optimizer %s, lr %g (%s), "
                "batch %zu per worker (%zu global), %zu steps/epoch, %zu parameters\n",
                o.ps_mode.c_str(), pushes.c_str(), o.transport.c_str(), workers, strategy.aggregation().servers(),
                o.optimizer.c_str(),
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
  const gradwire::time_source time = strategy.time();  // virtual on a simulated rank
  const auto start = time.now();
  int evaluated_epochs = 0;
  std::uint64_t my_steps = 0;
  gradwire::observe::step_stats epoch_stats;  // worker 0's steps since the last evaluation
  // Evaluations are numbered 1, 2, ...: K per epoch of the servers' progress.
  const int per_epoch = o.evals_per_epoch;
  auto evaluate = [&](int evaluation) {
    const double accuracy = model.accuracy(data.test.images, data.test.labels);
    const double elapsed = std::chrono::duration<double>(time.now() - start).count();
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
    const auto step_start = time.now();
    load_batch(data, order, step * global_batch + static_cast<std::size_t>(rank) * batch, x, y);
    model.loss_and_gradient(x, y);
    gradwire::simulation::compute(o.step_compute);
    if (straggling) std::this_thread::sleep_for((time.now() - step_start) * (o.straggler_factor - 1));
    strategy.step(gradients);
    epoch_stats += strategy.last_step_stats();
    ++my_steps;
  }
  print_parameter_hash(rank, model);
}

// --ps-mode's values in four groups, a trainer each (train_ps_<group>_<transport>.cpp):
// every mode is a type, and the nine of them times four optimizers took one translation
// unit 144 s and 1.5 GB to compile (four backup modes in one, 85 s). Each group calls fn
// with the mode that o.ps_mode names.
struct sync_modes {  // sync, async
  template <class Fn>
  static void dispatch(const std::string& mode, Fn&& fn) {
    if (mode == "async") fn(gradwire::ps::async{});
    else fn(gradwire::ps::sync{});
  }
};

struct bounded_modes {  // bounded:1, bounded:2, bounded:4
  template <class Fn>
  static void dispatch(const std::string& mode, Fn&& fn) {
    if (mode == "bounded:1") fn(gradwire::ps::bounded_staleness<1>{});
    else if (mode == "bounded:2") fn(gradwire::ps::bounded_staleness<2>{});
    else fn(gradwire::ps::bounded_staleness<4>{});
  }
};

struct backup_modes {  // backup:1, backup:2
  template <class Fn>
  static void dispatch(const std::string& mode, Fn&& fn) {
    if (mode == "backup:1") fn(gradwire::ps::backup_workers<1>{});
    else fn(gradwire::ps::backup_workers<2>{});
  }
};

struct many_backup_modes {  // backup:4, backup:8
  template <class Fn>
  static void dispatch(const std::string& mode, Fn&& fn) {
    if (mode == "backup:4") fn(gradwire::ps::backup_workers<4>{});
    else fn(gradwire::ps::backup_workers<8>{});
  }
};

// Modes: sync_modes, bounded_modes, backup_modes or many_backup_modes. Codec: the workers'
// pushes through it (family_ps_compressed.hpp: --compress), or none.
template <class Modes>
struct parameter_server {
  template <class Transport, class Optimizer, class Codec = gradwire::aggregation::no_codec>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run, Codec codec = {}) {
    const options& o = run.o;
    const data_set& data = run.data;
    model_type model({}, o.seed);
    gradwire::ps::options ps;
    ps.servers = run.servers;
    const int workers = transport.size() - run.servers;
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
    Modes::dispatch(o.ps_mode, [&]<class Mode>(Mode) {
      auto policy = [&] {
        if constexpr (std::is_same_v<Codec, gradwire::aggregation::no_codec>)
          return gradwire::aggregation::parameter_server<Mode>(ps);
        else
          return gradwire::aggregation::parameter_server<Mode>(ps).compress(codec);
      };
      gradwire::parameter_server<view, Optimizer, Mode, Transport, Codec> strategy(
          std::move(transport), model.parameter_views(), optimizer, policy());
      train_ps_replica(strategy, model, data, o, run.out);
    });
  }
};

}  // namespace fashion_mnist
