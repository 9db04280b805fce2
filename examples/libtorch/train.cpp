// Trains a LibTorch model (torch::nn MLP 784-256-128-10) on Fashion-MNIST with gradwire: all-reduce
// (mirrored on threads, multi_worker_mirrored across processes) or a parameter server, with each
// gradient handed to gradwire from an autograd hook as soon as it is accumulated, so communication
// overlaps the rest of backward (torch_bridge.hpp).
//
//   libtorch_train [--strategy all_reduce|parameter_server] [--ps-mode sync|async] [--transport inproc|tcp]
//                  [--ranks N] [--servers S] [--epochs E] [--batch B] [--lr LR] [--momentum M] [--steps K]
//                  [--data DIR | --synthetic] [--after-backward] [--bucket-kb KB] [--seed S]
//                  [--min-accuracy A]
//
// --transport inproc (default): N ranks (+ S servers) on threads of this process.
// --transport tcp: one rank per process, started by scripts/gradwire-run -n N [--ps S] (or
// torchrun, mpirun, srun). Each global step takes N*B samples of the shuffled epoch; worker w
// trains on samples [w*B, (w+1)*B) of them, so N replicas of batch B follow one model with
// batch N*B. --after-backward hands the gradients over only once backward is done
// (strategy.step), to compare with the overlapped default. --synthetic (or no data set
// installed): a generated problem (noisy copies of 10 random images). --min-accuracy: exit 1 below it.
// The optimizer is SGD with momentum (default 0.9). Asynchronous servers apply each worker's
// gradient on its own, N per global step, and stale gradients act like momentum (Mitliagkas
// et al. 2016): --ps-mode async wants about lr / N and little or no --momentum.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gradwire/gradwire.hpp>
#if GRADWIRE_HAS_ASIO
#include <gradwire/asio.hpp>
#endif

#include "../fashion_mnist/idx.hpp"
#include "torch_bridge.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

namespace gw = gradwire;

namespace {

struct options {
  std::string strategy = "all_reduce", ps_mode = "sync", transport = "inproc";
  int ranks = 2, servers = 1, epochs = 2;
  std::int64_t batch = 64, steps = 0;  // steps: stop each epoch after this many (0: the whole epoch)
  double lr = 0.05, momentum = 0.9, min_accuracy = 0;
  std::size_t bucket_kb = 0;  // 0: the all-reduce's default (25 MiB)
  std::string data = fashion_mnist::default_data_dir;
  bool synthetic = false, after_backward = false;
  std::uint64_t seed = 1;
};

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(std::string(flag) + " needs a value");
      return argv[++i];
    };
    auto number = [&](double min) {
      const std::string text = value();
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || !(v >= min))
        throw usage_error(std::string(flag) + " expects a number >= " + std::to_string(min) + ", got '" + text + "'");
      return v;
    };
    if (flag == "--strategy") o.strategy = value();
    else if (flag == "--ps-mode") o.ps_mode = value();
    else if (flag == "--transport") o.transport = value();
    else if (flag == "--ranks") o.ranks = int(number(1));
    else if (flag == "--servers") o.servers = int(number(1));
    else if (flag == "--epochs") o.epochs = int(number(1));
    else if (flag == "--batch") o.batch = std::int64_t(number(1));
    else if (flag == "--steps") o.steps = std::int64_t(number(0));
    else if (flag == "--lr") o.lr = number(0);
    else if (flag == "--momentum") o.momentum = number(0);
    else if (flag == "--min-accuracy") o.min_accuracy = number(0);
    else if (flag == "--bucket-kb") o.bucket_kb = std::size_t(number(1));
    else if (flag == "--seed") o.seed = std::uint64_t(number(0));
    else if (flag == "--data") o.data = value();
    else if (flag == "--synthetic") o.synthetic = true;
    else if (flag == "--after-backward") o.after_backward = true;
    else throw usage_error("unknown option " + std::string(flag) + " (see the top of examples/libtorch/train.cpp)");
  }
  if (o.strategy != "all_reduce" && o.strategy != "parameter_server")
    throw usage_error("--strategy is all_reduce or parameter_server, got '" + o.strategy + "'");
  if (o.ps_mode != "sync" && o.ps_mode != "async") throw usage_error("--ps-mode is sync or async");
  if (o.transport != "inproc" && o.transport != "tcp") throw usage_error("--transport is inproc or tcp");
  return o;
}

// --- the model ---------------------------------------------------------------------------
struct mlp_impl : torch::nn::Module {
  mlp_impl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE_IMPL(mlp, mlp_impl);

// --- the data: images as rows of 784 floats in [0, 1], labels as int64 ------------------
struct split {
  torch::Tensor images, labels;
  std::int64_t size() const { return labels.size(0); }
};
struct data_set {
  split train, test;
  std::string name;
};

split to_torch(const fashion_mnist::dataset<float>& d) {
  const auto n = static_cast<std::int64_t>(d.size());
  // Eigen stores a sample per column, column-major: rows of 784 floats for torch.
  auto images = torch::from_blob(const_cast<float*>(d.images.data()), {n, 784}, torch::kFloat).clone();
  auto labels = torch::empty({n}, torch::kLong);
  std::copy(d.labels.begin(), d.labels.end(), labels.data_ptr<std::int64_t>());
  return {images, labels};
}

// A problem a network can learn: each class a random 28x28 "image", each sample one of them
// half covered by uniform noise.
data_set synthetic_data(std::uint64_t seed) {
  torch::manual_seed(seed + 7);
  const auto prototypes = torch::rand({10, 784});
  auto make = [&](std::int64_t n) {
    auto labels = torch::randint(0, 10, {n}, torch::kLong);
    return split{0.5 * prototypes.index_select(0, labels) + 0.5 * torch::rand({n, 784}), labels};
  };
  return {make(8192), make(1024), "synthetic (10 noisy prototypes)"};
}

data_set load(const options& o) {
  if (!o.synthetic && std::filesystem::exists(std::filesystem::path(o.data) / "train-images-idx3-ubyte.gz")) {
    const auto d = fashion_mnist::load_fashion_mnist<float>(o.data);
    return {to_torch(d.train), to_torch(d.test), "Fashion-MNIST"};
  }
  if (!o.synthetic)
    std::printf("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist): synthetic data instead\n",
                o.data.c_str());
  return synthetic_data(o.seed);
}

double accuracy(mlp& model, const split& s) {
  torch::NoGradGuard no_grad;
  const auto predicted = model->forward(s.images).argmax(1);
  return predicted.eq(s.labels).sum().item<double>() / double(s.size());
}

// --- one replica's training ----------------------------------------------------------------
// worker, workers: this replica's index among the workers and their number (servers excluded).
template <class Strategy>
void train_worker(Strategy& strategy, mlp& model, torch_bridge::module_bridge& bridge, const data_set& data,
                  const options& o, int worker, int workers, double& final_accuracy) {
  const std::int64_t global = o.batch * workers;
  const std::int64_t steps = o.steps > 0 ? std::min(o.steps, data.train.size() / global) : data.train.size() / global;
  std::vector<std::int64_t> order(static_cast<std::size_t>(data.train.size()));
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed * 1000 + std::uint64_t(epoch)));  // same on every rank
    const auto permutation = torch::from_blob(order.data(), {std::int64_t(order.size())}, torch::kLong);
    const auto began = std::chrono::steady_clock::now();
    gw::observe::step_stats stats;
    double loss_sum = 0;
    for (std::int64_t k = 0; k < steps; ++k) {
      const auto rows = permutation.narrow(0, k * global + worker * o.batch, o.batch);
      const auto x = data.train.images.index_select(0, rows), y = data.train.labels.index_select(0, rows);
      const auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      if (o.after_backward) {
        loss.backward();                            // every gradient first,
        strategy.step(bridge.gradient_views());     // then all the communication
      } else {
        // [docs:step]
        auto step = strategy.begin_step();
        bridge.backward(loss, step);   // hooks: step.ready(i, grad i) as autograd accumulates each one
        step.finish();                 // waits for what is still in flight, applies the optimizer
        bridge.zero_grad();            // in place: the views stay valid
        // [/docs:step]
      }
      if (o.after_backward) bridge.zero_grad();
      loss_sum += loss.item<double>();
      stats += strategy.last_step_stats();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (worker == 0) {
      final_accuracy = accuracy(model, data.test);
      std::printf("epoch %d: loss %.4f, test accuracy %.2f%%, %.0f samples/s; per step: %s\n", epoch,
                  loss_sum / double(steps), 100 * final_accuracy, double(steps * global) / seconds,
                  gw::observe::to_string(stats).c_str());
      std::fflush(stdout);
    }
  }
}

// One rank on `transport`: a worker trains, a parameter server serves.
template <class Transport>
void run_rank(Transport transport, mlp& model, torch_bridge::module_bridge& bridge, const data_set& data,
              const options& o, int workers, double& final_accuracy) {
  const int rank = transport.rank();
  const auto optimizer = gw::optim::momentum({.lr = o.lr, .momentum = o.momentum});
  if (o.strategy == "all_reduce") {
    const auto all_reduce = o.bucket_kb ? gw::aggregation::all_reduce(o.bucket_kb << 10) : gw::aggregation::all_reduce();
    // mirrored over inproc, multi_worker_mirrored over asio_tcp
    gw::strategy<gw::tensor_view<float>, gw::optim::momentum, gw::aggregation::all_reduce, Transport> strategy(
        std::move(transport), bridge.parameter_views(), optimizer, all_reduce);
    train_worker(strategy, model, bridge, data, o, rank, workers, final_accuracy);
    return;
  }
  gw::ps::options ps;
  ps.servers = o.servers;
  auto serve_or_train = [&]<class Mode>(Mode) {
    gw::parameter_server<gw::tensor_view<float>, gw::optim::momentum, Mode, Transport> strategy(
        std::move(transport), bridge.parameter_views(), optimizer, gw::aggregation::parameter_server<Mode>(ps));
    if (strategy.is_server())
      strategy.serve();  // until every worker has finished
    else
      train_worker(strategy, model, bridge, data, o, rank, workers, final_accuracy);
  };
  if (o.ps_mode == "async")
    serve_or_train(gw::ps::async{});
  else
    serve_or_train(gw::ps::sync{});
}

// N ranks (+ S servers) on threads of this process.
double train_on_threads(const options& o, const data_set& data) {
  const int servers = o.strategy == "parameter_server" ? o.servers : 0;
  const int ranks = o.ranks + servers;
  double final_accuracy = 0;
  // [docs:threads]
  // Models (and their bridges) are built here, before the rank threads start: LibTorch's
  // default generator and parts of its lazy global set-up are process-wide, not for racing
  // threads. The strategy's constructor then copies rank 0's parameters to every replica.
  std::vector<mlp> models;
  std::vector<torch_bridge::module_bridge> bridges;
  for (int r = 0; r < ranks; ++r) {
    models.emplace_back();
    bridges.emplace_back(*models.back());
  }
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    torch::set_num_threads(std::max(1, cores / ranks));  // intra-op threads: the ranks share the cores
    const int r = endpoint.rank();
    run_rank(std::move(endpoint), models[r], bridges[r], data, o, o.ranks, final_accuracy);
  });
  // [/docs:threads]
  return final_accuracy;
}

#if GRADWIRE_HAS_ASIO
// One rank per process (scripts/gradwire-run -n N [--ps S]).
double train_in_process(options o, const data_set& data) {
  const auto spec = gw::cluster::detect();
  o.servers = spec.count(gw::cluster::task_type::ps);
  if (o.strategy == "parameter_server" && (o.servers == 0 || o.servers >= spec.world_size))
    throw usage_error("--strategy parameter_server --transport tcp: start it with scripts/gradwire-run -n WORKERS "
                      "--ps SERVERS");
  const int workers = spec.world_size - (o.strategy == "parameter_server" ? o.servers : 0);
  torch::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / spec.local_world_size));
  double final_accuracy = 0;
  mlp model;
  torch_bridge::module_bridge bridge(*model);
  run_rank(gw::cluster::join_tcp(), model, bridge, data, o, workers, final_accuracy);
  return spec.rank == 0 ? final_accuracy : -1;  // only the first worker evaluates
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    torch::manual_seed(o.seed);
    const data_set data = load(o);
    double final_accuracy = 0;
    if (o.transport == "tcp") {
#if GRADWIRE_HAS_ASIO
      if (gw::cluster::detect().rank == 0)
        std::printf("%s, %s over TCP, %s\n", data.name.c_str(), o.strategy.c_str(),
                    o.after_backward ? "gradients after backward" : "gradients from autograd hooks");
      final_accuracy = train_in_process(o, data);
#else
      throw usage_error("--transport tcp: this build lacks gradwire::asio (install libboost-dev nlohmann-json3-dev)");
#endif
    } else {
      std::printf("%s, %s on %d threads%s, %s\n", data.name.c_str(), o.strategy.c_str(), o.ranks,
                  o.strategy == "parameter_server" ? (" + " + std::to_string(o.servers) + " server(s)").c_str() : "",
                  o.after_backward ? "gradients after backward" : "gradients from autograd hooks");
      final_accuracy = train_on_threads(o, data);
    }
    if (final_accuracy >= 0 && final_accuracy < o.min_accuracy) {
      std::fprintf(stderr, "libtorch_train: test accuracy %.4f is below --min-accuracy %.4f\n", final_accuracy,
                   o.min_accuracy);
      return 1;
    }
    return 0;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "libtorch_train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_train: %s\n", e.what());
    return 1;
  }
}
