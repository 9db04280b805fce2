// Step time of a LibTorch MLP whose backward pass dominates: compute only, gradwire after backward, gradwire overlapped.
//
// One process per rank, started by scripts/gradwire-run (benchmarks/overlap.sh runs it on
// emulated hosts, beside PyTorch DDP running benchmarks/overlap_ddp.py on the same model):
//
//   gradwire-run -n 2 overlap --mode end       (b) strategy.step(grads) after backward
//   gradwire-run -n 2 overlap --mode overlap   (c) step.ready(i, grad) from autograd hooks, then finish()
//   gradwire-run -n 2 overlap --mode compute   (a) every rank alone (one_device): forward, backward,
//                                                   optimizer; the ranks only meet before and after
//
// The model, its initialisation, the data and the batches are defined exactly as in
// overlap_ddp.py, so that the two sides start from the same parameters (the init checksum
// says so) and see the same samples: MLP 784 -> width x depth -> 10 with ReLU, every Linear's
// weight and bias drawn uniform(-1/sqrt(fan_in), +1/sqrt(fan_in)) in order after
// torch::manual_seed(seed); Fashion-MNIST pixels standardised with the training set's
// mean and (unbiased) std computed in double from the byte histogram; step k of rank r
// trains on training samples (k * world + r) * batch onwards (wrapping), no shuffling.
// Optimizer: SGD with momentum (PyTorch's formula), the gradient averaged over ranks.
//
// A step's time runs from zeroing the gradients to the optimizer's end (the batch is
// filled before the clock starts); rank 0 reports the median, 10th and 90th percentile over
// the timed steps and the median of the part after backward returned (the communication
// left to wait for, and the optimizer), then the loss and accuracy on the first --eval test
// samples and the parameters' checksum after the last step, and appends one CSV row.
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <gradwire/asio.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/strategy.hpp>
#include <string>
#include <vector>

#include "../examples/fashion_mnist/idx.hpp"
#include "../examples/libtorch/torch_bridge.hpp"

namespace gw = gradwire;

namespace {

struct options {
  std::string mode = "end";  // compute, end, overlap
  int width = 2048, depth = 4, batch = 16, steps = 20, warmup = 3, threads = 1, eval = 2000;
  double lr = 0.01, momentum = 0.9;
  std::uint64_t seed = 1;
  std::size_t bucket_mb = 25;
  std::string data = fashion_mnist::default_data_dir;
  std::string csv;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "overlap: %s\n"
               "usage: overlap [--mode compute|end|overlap] [--width W] [--depth D] [--batch B] [--steps N]\n"
               "               [--warmup N] [--lr X] [--momentum X] [--seed S] [--threads T] [--eval N]\n"
               "               [--bucket-mb M] [--data DIR] [--csv FILE]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](long lo) {
      const std::string v = value();
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end || x < lo) usage(a + " takes an integer >= " + std::to_string(lo) + ", got '" + v + "'");
      return x;
    };
    auto real = [&] {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end || !(x >= 0)) usage(a + " takes a number >= 0, got '" + v + "'");
      return x;
    };
    if (a == "--mode") {
      o.mode = value();
      if (o.mode != "compute" && o.mode != "end" && o.mode != "overlap")
        usage("--mode takes compute, end or overlap, got '" + o.mode + "'");
    } else if (a == "--width") o.width = int(number(1));
    else if (a == "--depth") o.depth = int(number(1));
    else if (a == "--batch") o.batch = int(number(1));
    else if (a == "--steps") o.steps = int(number(1));
    else if (a == "--warmup") o.warmup = int(number(0));
    else if (a == "--threads") o.threads = int(number(1));
    else if (a == "--eval") o.eval = int(number(1));
    else if (a == "--seed") o.seed = std::uint64_t(number(0));
    else if (a == "--bucket-mb") o.bucket_mb = std::size_t(number(1));
    else if (a == "--lr") o.lr = real();
    else if (a == "--momentum") o.momentum = real();
    else if (a == "--data") o.data = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "-h" || a == "--help") usage("help");
    else usage("unknown option '" + a + "'");
  }
  return o;
}

constexpr int features = 784, classes = 10;

// Fashion-MNIST as bytes plus the one table that turns a byte into a standardised float
// (the same table overlap_ddp.py builds, so both sides train on bit-identical inputs).
struct data_set {
  fashion_mnist::idx_images train, test;
  fashion_mnist::idx_labels train_labels, test_labels;
  std::array<float, 256> table{};

  explicit data_set(const std::filesystem::path& dir)
      : train(fashion_mnist::read_idx_images(dir / "train-images-idx3-ubyte.gz")),
        test(fashion_mnist::read_idx_images(dir / "t10k-images-idx3-ubyte.gz")),
        train_labels(fashion_mnist::read_idx_labels(dir / "train-labels-idx1-ubyte.gz")),
        test_labels(fashion_mnist::read_idx_labels(dir / "t10k-labels-idx1-ubyte.gz")) {
    std::array<double, 256> count{};
    for (std::uint8_t p : train.pixels) count[p] += 1;
    const double n = double(train.pixels.size());
    double mean = 0;
    for (int v = 0; v < 256; ++v) mean += count[v] * (v / 255.0);
    mean /= n;
    double var = 0;
    for (int v = 0; v < 256; ++v) var += count[v] * (v / 255.0 - mean) * (v / 255.0 - mean);
    const double sd = std::sqrt(var / (n - 1));
    for (int v = 0; v < 256; ++v) table[v] = float((v / 255.0 - mean) / sd);
  }
  std::size_t train_count() const { return train_labels.labels.size(); }

  // Samples first, first + 1, ... (wrapping) of `images` into x and y.
  void fill(const fashion_mnist::idx_images& images, const fashion_mnist::idx_labels& labels, std::size_t first,
            torch::Tensor& x, torch::Tensor& y) const {
    const std::size_t n = labels.labels.size(), rows = std::size_t(x.size(0));
    float* xp = x.data_ptr<float>();
    std::int64_t* yp = y.data_ptr<std::int64_t>();
    for (std::size_t j = 0; j < rows; ++j) {
      const std::size_t s = (first + j) % n;
      const std::uint8_t* px = images.pixels.data() + s * features;
      for (int f = 0; f < features; ++f) xp[j * features + f] = table[px[f]];
      yp[j] = labels.labels[s];
    }
  }
};

torch::nn::Sequential make_model(const options& o) {
  torch::manual_seed(o.seed);
  torch::nn::Sequential model;
  int in = features;
  for (int l = 0; l < o.depth; ++l) {
    model->push_back(torch::nn::Linear(in, o.width));
    model->push_back(torch::nn::ReLU());
    in = o.width;
  }
  model->push_back(torch::nn::Linear(in, classes));
  // Re-drawn explicitly in parameter order (weight, bias per layer): overlap_ddp.py does
  // the same, so the draws do not depend on either side's default initialisation.
  torch::NoGradGuard no_grad;
  for (auto& m : model->modules(/*include_self=*/false)) {
    if (auto* linear = m->as<torch::nn::Linear>()) {
      const double bound = 1.0 / std::sqrt(double(linear->options.in_features()));
      linear->weight.uniform_(-bound, bound);
      linear->bias.uniform_(-bound, bound);
    }
  }
  return model;
}

double checksum(torch::nn::Sequential& model) {
  double sum = 0;
  for (const auto& p : model->parameters()) sum += p.to(torch::kDouble).sum().item<double>();
  return sum;
}

struct evaluation {
  double loss = 0, accuracy = 0;
};
evaluation evaluate(torch::nn::Sequential& model, const data_set& d, int count) {
  torch::NoGradGuard no_grad;
  const int n = std::min<int>(count, int(d.test_labels.labels.size()));
  auto x = torch::empty({n, features});
  auto y = torch::empty({n}, torch::kLong);
  d.fill(d.test, d.test_labels, 0, x, y);
  const auto out = model->forward(x);
  return {torch::nn::functional::cross_entropy(out, y).item<double>(),
          out.argmax(1).eq(y).to(torch::kDouble).mean().item<double>()};
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const double pos = q * double(v.size() - 1);
  const auto lo = std::size_t(pos);
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

using view = gw::tensor_view<float>;
using clock_type = std::chrono::steady_clock;

// The timed steps: whole step, and the part after backward returned (what is left of the
// communication, and the optimizer).
struct timings {
  std::vector<double> step_ms, after_backward_ms;
};

// Trains --warmup + --steps steps; `step` does one step's zero/forward/backward/update and
// returns the time backward returned.
template <class Step>
timings train(const options& o, const data_set& d, int rank, int world, torch::Tensor& x, torch::Tensor& y,
              Step&& step) {
  timings t;
  auto ms = [](clock_type::duration e) { return std::chrono::duration<double, std::milli>(e).count(); };
  for (int k = 0; k < o.warmup + o.steps; ++k) {
    d.fill(d.train, d.train_labels, (std::size_t(k) * std::size_t(world) + std::size_t(rank)) * std::size_t(o.batch),
           x, y);
    const auto began = clock_type::now();
    const clock_type::time_point backward_done = step();
    const auto ended = clock_type::now();
    if (k < o.warmup) continue;
    t.step_ms.push_back(ms(ended - began));
    t.after_backward_ms.push_back(ms(ended - backward_done));
  }
  return t;
}

torch::Tensor loss_of(torch::nn::Sequential& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  torch::set_num_threads(o.threads);
  const auto spec = gw::cluster::detect();
  const int rank = spec.rank, world = spec.world_size;

  const data_set d(o.data);
  auto model = make_model(o);
  const double init_sum = checksum(model);
  // Views of the model's parameters and .grad tensors (allocated once, zeroed in place, so
  // backward accumulates into the same memory every step), and the hooks of mode overlap.
  torch_bridge::module_bridge bridge(*model);
  std::size_t elements = 0;
  for (const auto& v : bridge.parameter_views()) elements += v.size();
  auto x = torch::empty({o.batch, features});
  auto y = torch::empty({o.batch}, torch::kLong);
  const gw::optim::momentum optimizer({.lr = o.lr, .momentum = o.momentum});

  timings ms;
  if (o.mode == "compute") {
    // Every rank alone; the ranks only meet so that they compute at the same time.
    std::optional<gw::collective::communicator<gw::transport::asio_tcp>> meet;
    if (world > 1) meet.emplace(gw::cluster::join_tcp());
    gw::one_device<view, gw::optim::momentum> s(bridge.parameter_views(), optimizer);
    if (meet) gw::collective::barrier(*meet);
    ms = train(o, d, rank, world, x, y, [&] {
      bridge.zero_grad();
      loss_of(model, x, y).backward();
      const auto backward_done = clock_type::now();
      s.step(bridge.gradient_views());
      return backward_done;
    });
    if (meet) gw::collective::barrier(*meet);
  } else {
    gw::multi_worker_mirrored<view, gw::optim::momentum> s(gw::cluster::join_tcp(), bridge.parameter_views(),
                                                           optimizer, gw::aggregation::all_reduce(o.bucket_mb << 20));
    if (o.mode == "end") {
      // (b) The whole backward pass first, then every gradient in one call.
      ms = train(o, d, rank, world, x, y, [&] {
        bridge.zero_grad();
        loss_of(model, x, y).backward();
        const auto backward_done = clock_type::now();
        s.step(bridge.gradient_views());
        return backward_done;
      });
    } else {
      // (c) Each gradient handed over from its autograd hook as soon as it is final; full
      // buckets travel while backward computes the earlier layers' gradients.
      ms = train(o, d, rank, world, x, y, [&] {
        bridge.zero_grad();
        auto step = s.begin_step();
        bridge.backward(loss_of(model, x, y), step);
        const auto backward_done = clock_type::now();
        step.finish();
        return backward_done;
      });
    }
  }

  if (rank == 0) {
    const auto e = evaluate(model, d, o.eval);
    const double final_sum = checksum(model);
    const double median = percentile(ms.step_ms, 0.5), p10 = percentile(ms.step_ms, 0.1),
                 p90 = percentile(ms.step_ms, 0.9), after = percentile(ms.after_backward_ms, 0.5);
    const double samples = median > 0 ? 1e3 * double(world) * o.batch / median : 0;
    std::printf("# overlap gradwire %s: %d rank(s), %zu parameters (%.1f MB of gradients), batch %d per rank, %d+%d steps\n",
                o.mode.c_str(), world, elements, 4e-6 * double(elements), o.batch, o.warmup, o.steps);
    std::printf("# step time median %.1f ms (p10 %.1f, p90 %.1f; after backward %.1f), %.1f samples/s; eval loss "
                "%.6f acc %.4f; checksum init %.9e final %.9e\n",
                median, p10, p90, after, samples, e.loss, e.accuracy, init_sum, final_sum);
    if (!o.csv.empty()) {
      const bool fresh = !std::filesystem::exists(o.csv) || std::filesystem::file_size(o.csv) == 0;
      std::ofstream f(o.csv, std::ios::app);
      if (fresh)
        f << "impl,mode,world,params,batch,warmup,steps,threads,step_ms_median,step_ms_p10,step_ms_p90,"
             "samples_per_s,eval_loss,eval_acc,init_checksum,final_checksum,after_backward_ms_median\n";
      char row[512];
      std::snprintf(row, sizeof row, "gradwire,%s,%d,%zu,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.2f,%.6f,%.4f,%.9e,%.9e,%.3f\n",
                    o.mode.c_str(), world, elements, o.batch, o.warmup, o.steps, o.threads, median, p10, p90, samples,
                    e.loss, e.accuracy, init_sum, final_sum, after);
      f << row;
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "overlap: %s\n", e.what());
  return 1;
}
