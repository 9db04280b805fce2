// fashion_mnist --device cuda: the same training loop as main.cpp's, with the model on the GPU
// (mlp_cuda.cuh) and gradwire's strategies over cuda_tensor: one_device; mirrored and
// central_storage with replicas as threads, each on its own stream of one device; and
// multi_worker_mirrored / central_storage with one replica per process, over the TCP or UCX
// transport main.cpp joins (erased: transport::any_transport), each process on the device
// its local rank picks.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradwire/cuda.cuh>

#include "cuda_training.hpp"
#include "mlp_cuda.cuh"

namespace fashion_mnist {
namespace {

using steady = std::chrono::steady_clock;
using tensor = gradwire::cuda_tensor<float>;

// A data set copied to the device once; batches are gathered there.
struct device_set {
  tensor images;
  gradwire::cuda::device_buffer<int> label_buffer;
  const int* labels = nullptr;
  device_set(const float* host_images, const int* host_labels, std::size_t count, std::size_t pixels, cudaStream_t s)
      : images(gradwire::shape{count * pixels}, std::span<const float>(host_images, count * pixels), s),
        label_buffer(s) {
    label_buffer.reserve_discard(count);
    gradwire::cuda::check(cudaMemcpyAsync(label_buffer.data(), host_labels, count * sizeof(int),
                                          cudaMemcpyHostToDevice, s),
                          "labels to the device");
    gradwire::cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    labels = label_buffer.data();
  }
};

template <class Strategy>
void train_replica(Strategy& strategy, mlp_cuda& model, const device_set& train, const device_set& test,
                   const cuda_run& run, cudaStream_t stream, std::mutex& print, cuda_result& out) {
  const int rank = strategy.rank(), replicas = strategy.size();
  const auto batch = std::size_t(run.batch);
  const std::size_t global_batch = batch * std::size_t(replicas);
  const std::size_t steps = run.train_count / global_batch;
  if (steps == 0) throw std::runtime_error("the global batch exceeds the training set");
  const std::size_t test_begin = run.test_count * std::size_t(rank) / std::size_t(replicas);
  const std::size_t test_end = run.test_count * std::size_t(rank + 1) / std::size_t(replicas);

  std::vector<int> order(run.train_count);
  std::iota(order.begin(), order.end(), 0);
  gradwire::cuda::device_buffer<int> order_device(stream);
  order_device.reserve_discard(run.train_count);
  int* order_on_device = order_device.data();
  const std::size_t total_steps = steps * std::size_t(run.epochs);
  if (rank == 0) {
    std::lock_guard lock(print);
    std::printf("strategy %s on the GPU (%d replica(s) as %s), optimizer %s, lr %g (%s), batch "
                "%zu per replica (%zu global), %zu steps/epoch\n",
                run.strategy.c_str(), replicas, run.join ? "processes" : "threads, one stream each",
                run.optimizer.c_str(), run.lr, run.cosine ? "cosine" : "constant",
                batch, global_batch, steps);
    std::fflush(stdout);
  }

  const auto start = steady::now();
  for (int epoch = 1; epoch <= run.epochs; ++epoch) {
    // The permutation main.cpp draws: a device run follows the host run's batches.
    std::vector<std::size_t> perm(run.train_count);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::mt19937_64 rng(run.seed * 0x9e3779b97f4a7c15ULL + std::uint64_t(epoch));
    std::shuffle(perm.begin(), perm.end(), rng);
    std::transform(perm.begin(), perm.end(), order.begin(), [](std::size_t i) { return int(i); });
    gradwire::cuda::check(cudaMemcpyAsync(order_on_device, order.data(), order.size() * sizeof(int),
                                          cudaMemcpyHostToDevice, stream),
                          "order to the device");
    const auto epoch_start = steady::now();
    double loss_sum = 0;
    gradwire::observe::step_stats epoch_stats;  // this replica's steps: bytes, communication vs compute
    for (std::size_t step = 0; step < steps; ++step) {
      model.load_batch(train.images.data(), train.labels, order_on_device, step * global_batch + std::size_t(rank) * batch,
                       run.batch);
      loss_sum += model.loss_and_gradient(strategy.parameters(), run.batch);
      if (run.cosine) {
        constexpr double pi = 3.14159265358979323846;
        const double t = double((std::size_t(epoch) - 1) * steps + step) / double(total_steps);
        strategy.optimizer().set_lr(run.lr * 0.5 * (1.0 + std::cos(pi * t)));
      }
      strategy.step(model.gradients());
      epoch_stats += strategy.last_step_stats();
    }
    const double train_seconds = std::chrono::duration<double>(steady::now() - epoch_start).count();
    std::array<double, 3> stats{loss_sum, double(steps), 0.0};
    stats[2] = double(model.count_correct(strategy.parameters(), test.images.data() + test_begin * run.pixels,
                                          test.labels + test_begin, test_end - test_begin));
    gradwire::collective::all_reduce(strategy.communicator(), std::span<double>(stats));
    if (rank == 0) {
      out.chief = true;
      const double elapsed = std::chrono::duration<double>(steady::now() - start).count();
      const double accuracy = stats[2] / double(run.test_count);
      std::lock_guard lock(print);
      std::printf("epoch %2d/%d  train_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %6.1f s\n", epoch,
                  run.epochs, stats[0] / stats[1], 100.0 * accuracy, double(steps * global_batch) / train_seconds,
                  elapsed);
      std::printf("          rank 0: %s\n", gradwire::observe::to_string(epoch_stats).c_str());
      std::fflush(stdout);
      out.final_accuracy = accuracy;
      out.total_seconds = elapsed;
      if (out.epoch_reached == 0 && accuracy >= run.target_accuracy) {
        out.epoch_reached = epoch;
        out.seconds_reached = elapsed;
      }
    }
  }
}

template <class Optimizer>
cuda_result train(const cuda_run& run, const Optimizer& optimizer) {
  const int devices = gradwire::cuda::device_count();
  if (devices == 0)
    throw gradwire::error(gradwire::errc::device, "--device cuda: no CUDA device (or no driver) on this machine");
  // One process per replica: spread them over the machine's GPUs (before anything is allocated).
  if (run.join) gradwire::cuda::check(cudaSetDevice(run.local_rank % devices), "cudaSetDevice");
  namespace aggregation = gradwire::aggregation;
  cuda_result out;
  std::mutex print;
  // One copy of the data set on the device, shared by the replicas (read only).
  gradwire::cuda::stream data_stream;
  const device_set train_set(run.train_images, run.train_labels, run.train_count, run.pixels, data_stream);
  const device_set test_set(run.test_images, run.test_labels, run.test_count, run.pixels, data_stream);

  // A replica's initial parameters, on its stream.
  auto initial_parameters = [&](cudaStream_t stream) {
    std::vector<tensor> parameters;
    for (std::size_t i = 0; i < run.initial.size(); ++i)
      parameters.emplace_back(run.shapes[i], run.initial[i], stream);
    return parameters;
  };
  auto replica = [&]<class Transport>(Transport transport) {
    gradwire::cuda::stream stream;
    std::vector<tensor> parameters = initial_parameters(stream);
    mlp_cuda model(run.rows, run.cols, run.batch, stream);
    if (run.strategy == "central_storage") {
      gradwire::central_storage<tensor, Optimizer, Transport> strategy(std::move(transport), std::move(parameters),
                                                                       optimizer, aggregation::central(run.owner));
      train_replica(strategy, model, train_set, test_set, run, stream, print, out);
    } else {
      gradwire::strategy<tensor, Optimizer, aggregation::all_reduce, Transport> strategy(
          std::move(transport), std::move(parameters), optimizer);
      train_replica(strategy, model, train_set, test_set, run, stream, print, out);
    }
  };
  if (run.strategy == "one_device") {
    gradwire::cuda::stream stream;
    mlp_cuda model(run.rows, run.cols, run.batch, stream);
    gradwire::one_device<tensor, Optimizer> strategy(initial_parameters(stream), optimizer);
    train_replica(strategy, model, train_set, test_set, run, stream, print, out);
  } else if (run.join) {
    replica(run.join());
  } else {
    gradwire::transport::run_inproc(run.replicas,
                                    [&](gradwire::transport::inproc endpoint) { replica(std::move(endpoint)); });
  }
  return out;
}

}  // namespace

cuda_result train_on_cuda(const cuda_run& run) {
  namespace optim = gradwire::optim;
  if (run.optimizer == "sgd") return train(run, optim::sgd({.lr = run.lr}));
  if (run.optimizer == "momentum") return train(run, optim::momentum({.lr = run.lr, .momentum = 0.9}));
  if (run.optimizer == "adamw") {
    optim::adamw::options settings;
    settings.lr = run.lr;
    return train(run, optim::adamw(settings));
  }
  optim::adam::options settings;
  settings.lr = run.lr;
  return train(run, optim::adam(settings));
}

}  // namespace fashion_mnist
