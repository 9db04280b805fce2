// The elastic all-reduce family (--min-replicas M): multi_worker_mirrored that shrinks past a lost replica and
// goes on while M remain (docs/elastic.md), over asio_tcp, ucx or the simulator (die=RANK@TIME).
//
// Its loop differs from train_loop.hpp's where the job's size may change under it: each step's
// batch comes from an elastic sampler partitioned by the view the previous step summed, so
// that within an epoch no sample is lost or read twice; every replica evaluates the whole
// test set itself (the replicas are identical, and a collective could meet the next loss);
// the lowest rank still in prints and records. Over TCP a replacement of a lost replica
// (GRADWIRE_REJOIN=1: scripts/gradwire-run --max-restarts) is taken back in: it receives the
// model, the optimizer state, the step count and the sampler's state from the others, and
// goes on from their epoch and step.
#pragma once

#include <algorithm>

#include <gradwire/aggregation/elastic_all_reduce.hpp>
#include <gradwire/training/elastic_sampler.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

template <class Strategy>
void train_elastic_replica(Strategy& strategy, model_type& model, const data_set& data, const options& o, summary& out) {
  const int rank = strategy.rank();
  auto& agent = strategy.aggregation();
  const gradwire::time_source time = strategy.time();
  const auto batch = static_cast<std::size_t>(o.batch);
  const std::size_t n_train = data.train.size(), n_test = data.test.size();
  gradwire::training::elastic_sampler sampler(n_train, batch, o.seed);
  matrix x(model.sizes().input, static_cast<Eigen::Index>(batch));
  std::vector<int> y(batch);
  auto gradients = model.gradient_views();

  // The cosine runs over the run's samples rather than its steps: after a loss an epoch has
  // more, smaller steps, and the schedule still ends with the last epoch.
  auto set_lr = [&](double epochs_done) {
    if (o.schedule != "cosine") return;
    constexpr double pi = 3.14159265358979323846;
    const double t = std::min(1.0, epochs_done / double(o.epochs));
    strategy.optimizer().set_lr(*o.lr * 0.5 * (1.0 + std::cos(pi * t)));
  };
  auto chief = [&] { return agent.view().members.front() == rank; };
  if (rank == 0) {
    std::printf("strategy %s (elastic, min replicas %d) over %s, replicas %d, optimizer %s, lr %g (%s), batch %zu per "
                "replica, %zu parameters\n",
                o.strategy.c_str(), o.min_replicas, o.transport.c_str(), strategy.size(), o.optimizer.c_str(), *o.lr,
                o.schedule.c_str(), batch, model.parameter_count());
    std::fflush(stdout);
  }
  const bool straggling = rank == o.straggler_rank && o.straggler_factor > 1;

  const auto start = time.now();
  gradwire::transport::view partition;  // the current step's
  // A replacement's sampler comes from the member that welcomes it: the sampler as this
  // step leaves it (on_join runs inside the step, once it is applied).
  agent.on_join([&] {
    gradwire::training::elastic_sampler after = sampler;
    after.step_applied(partition, agent.last_step_view().members);
    return after.save();
  });
  const bool replacement = std::ranges::count(agent.joined_ranks(), rank) > 0;
  int first_epoch = 1;
  if (replacement) {
    sampler.restore(agent.loop_state());
    first_epoch = static_cast<int>(sampler.epoch());
    std::printf("rank %d: rejoined at step %llu, epoch %d, %zu samples into it\n", rank,
                static_cast<unsigned long long>(agent.applying_step()), first_epoch, sampler.read());
    std::fflush(stdout);
  }
  std::uint64_t global_step = agent.applying_step();
  std::uint32_t seen_epoch = agent.view().epoch;
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    if (!(replacement && epoch == first_epoch)) sampler.begin_epoch(static_cast<std::uint64_t>(epoch));
    const auto epoch_start = time.now();
    const std::size_t read_before = sampler.read();
    double loss_sum = 0;
    std::size_t steps_done = 0;
    while (sampler.has_step(agent.last_step_view())) {
      partition = agent.last_step_view();
      const auto share = sampler.share(partition, rank);
      const auto step_start = time.now();
      load_batch(data, share, 0, x, y);
      loss_sum += model.loss_and_gradient(x, y);
      gradwire::simulation::compute(o.step_compute);  // modelled work: nothing unless simulated
      if (straggling) std::this_thread::sleep_for((time.now() - step_start) * (o.straggler_factor - 1));
      set_lr(double(epoch - 1) + double(sampler.read()) / double(n_train));
      strategy.step(gradients);
      sampler.step_applied(partition, agent.last_step_view().members);
      ++steps_done;
      ++global_step;
      if (agent.view().epoch != seen_epoch) {
        seen_epoch = agent.view().epoch;
        std::string members, lost;
        for (int r : agent.view().members) members += (members.empty() ? "" : ",") + std::to_string(r);
        for (int r : agent.lost_ranks()) lost += (lost.empty() ? "" : ",") + std::to_string(r);
        std::printf("rank %d: view %u at step %llu: ranks %s go on (lost %s)\n", rank, seen_epoch,
                    static_cast<unsigned long long>(global_step), members.c_str(), lost.c_str());
        std::fflush(stdout);
      }
    }
    const double train_seconds = std::chrono::duration<double>(time.now() - epoch_start).count();
    // Within the epoch each sample was applied at most once, and all but fewer than a global
    // batch were: the sampler's count, checked on every replica.
    std::size_t once = 0;
    for (std::uint32_t c : sampler.spent()) {
      if (c > 1) throw std::logic_error("elastic sampler: a sample was applied twice in epoch " + std::to_string(epoch));
      once += c;
    }
    if (once + sampler.left() != n_train)
      throw std::logic_error("elastic sampler: " + std::to_string(n_train - once - sampler.left()) +
                             " samples were lost in epoch " + std::to_string(epoch));
    std::size_t correct = 0;
    for (Eigen::Index begin = 0; begin < static_cast<Eigen::Index>(n_test); begin += 1000) {
      const Eigen::Index n = std::min<Eigen::Index>(1000, static_cast<Eigen::Index>(n_test) - begin);
      correct += model.count_correct(data.test.images.middleCols(begin, n),
                                     std::span<const int>(data.test.labels).subspan(static_cast<std::size_t>(begin),
                                                                                   static_cast<std::size_t>(n)));
    }
    if (chief()) {
      const double elapsed = std::chrono::duration<double>(time.now() - start).count();
      const double accuracy = double(correct) / double(n_test);
      std::printf("epoch %2d/%d  train_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %6.1f s  replicas %d\n",
                  epoch, o.epochs, loss_sum / double(std::max<std::size_t>(1, steps_done)), 100.0 * accuracy,
                  double(sampler.read() - read_before) / train_seconds, elapsed, agent.view().size());
      std::printf("rank %d: epoch %d samples: %zu applied once, %zu left over, none twice\n", rank, epoch, once,
                  sampler.left());
      std::fflush(stdout);
      out.record(epoch, accuracy, elapsed, o.target_accuracy);
    }
  }
  print_parameter_hash(rank, model);
}

struct elastic {
  template <class Transport, class Optimizer>
  static void replica(Transport transport, const Optimizer& optimizer, const run_context& run) {
    model_type model({}, run.o.seed);
    gradwire::strategy<view, Optimizer, gradwire::aggregation::elastic_all_reduce, Transport> strategy(
        std::move(transport), model.parameter_views(), optimizer,
        gradwire::aggregation::elastic_all_reduce(
            gradwire::aggregation::elastic_options{.min_replicas = run.o.min_replicas}));
    train_elastic_replica(strategy, model, run.data, run.o, run.out);
  }
};

}  // namespace fashion_mnist
