// What the docs' snippets call "yours" (a model, its data), and float64 references to check them against.
//
// The model is linear least squares, y ~ W x + b, with gradients of 0.5 * mean over a
// batch of |W x + b - y|^2 accumulated in double. The mean gradient of N shards of b rows
// is the gradient of their N*b rows, so N replicas must follow the float64 reference that
// trains on the whole global batch (the README's claim), up to float rounding.
#pragma once

#include <gradwire/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace snippets {

// Rows of inputs and targets, row-major, in double.
struct batch {
  std::size_t rows = 0;
  std::vector<double> x, y;
};

struct layer {
  std::size_t inputs, outputs;
  std::size_t weights() const { return inputs * outputs; }
  std::size_t parameters() const { return weights() + outputs; }  // W (outputs x inputs), then b
};

// `count` batches of `rows` rows whose targets a linear model fits up to a little noise.
inline std::vector<batch> make_batches(layer shape, std::size_t count, std::size_t rows, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<double> a(shape.weights()), c(shape.outputs);
  for (auto& v : a) v = normal(gen) / std::sqrt(double(shape.inputs));
  for (auto& v : c) v = normal(gen);
  std::vector<batch> batches(count);
  for (auto& d : batches) {
    d.rows = rows;
    d.x.resize(rows * shape.inputs);
    d.y.resize(rows * shape.outputs);
    for (auto& v : d.x) v = normal(gen);
    for (std::size_t n = 0; n < rows; ++n)
      for (std::size_t o = 0; o < shape.outputs; ++o) {
        double y = c[o] + 0.01 * normal(gen);
        for (std::size_t i = 0; i < shape.inputs; ++i) y += a[o * shape.inputs + i] * d.x[n * shape.inputs + i];
        d.y[n * shape.outputs + o] = y;
      }
  }
  return batches;
}

// Replica `rank`'s rows of every global batch (replicas rows each; the rows divide evenly).
inline std::vector<batch> shard(layer shape, const std::vector<batch>& global, int rank, int replicas) {
  std::vector<batch> mine;
  for (const auto& g : global) {
    const std::size_t rows = g.rows / std::size_t(replicas), first = rows * std::size_t(rank);
    batch d;
    d.rows = rows;
    d.x.assign(g.x.begin() + std::ptrdiff_t(first * shape.inputs), g.x.begin() + std::ptrdiff_t((first + rows) * shape.inputs));
    d.y.assign(g.y.begin() + std::ptrdiff_t(first * shape.outputs),
               g.y.begin() + std::ptrdiff_t((first + rows) * shape.outputs));
    mine.push_back(std::move(d));
  }
  return mine;
}

// Gradient with respect to [W, b] at `wb` (any floating type), in double.
template <class T>
std::vector<double> gradient(layer shape, std::span<const T> wb, const batch& d) {
  std::vector<double> g(shape.parameters(), 0.0);
  const T* w = wb.data();
  const T* b = wb.data() + shape.weights();
  for (std::size_t n = 0; n < d.rows; ++n)
    for (std::size_t o = 0; o < shape.outputs; ++o) {
      double r = double(b[o]) - d.y[n * shape.outputs + o];
      for (std::size_t i = 0; i < shape.inputs; ++i) r += double(w[o * shape.inputs + i]) * d.x[n * shape.inputs + i];
      r /= double(d.rows);
      g[shape.weights() + o] += r;
      for (std::size_t i = 0; i < shape.inputs; ++i) g[o * shape.inputs + i] += r * d.x[n * shape.inputs + i];
    }
  return g;
}

template <class T>
double loss(layer shape, std::span<const T> wb, const std::vector<batch>& data) {
  double sum = 0;
  std::size_t rows = 0;
  for (const auto& d : data)
    for (std::size_t n = 0; n < d.rows; ++n, ++rows)
      for (std::size_t o = 0; o < shape.outputs; ++o) {
        double r = double(wb[shape.weights() + o]) - d.y[n * shape.outputs + o];
        for (std::size_t i = 0; i < shape.inputs; ++i) r += double(wb[o * shape.inputs + i]) * d.x[n * shape.inputs + i];
        sum += 0.5 * r * r;
      }
  return rows ? sum / double(rows) : 0.0;
}

// The model the docs call `Model`: parameters and gradients in float, in its own memory,
// shown to gradwire as views. Every model records its final parameters when it is
// destroyed, so that a program can check replicas that lived on threads it did not see.
class Model {
 public:
  static constexpr layer shape{6, 3};

  explicit Model(unsigned seed) : grads_(shape.parameters()) {
    for (double v : initial_values(seed)) values_.push_back(float(v));
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() {
    const std::lock_guard<std::mutex> lock(mutex());
    finished().push_back(values_);
  }

  std::vector<gradwire::tensor_view<float>> parameter_views() { return views(values_); }
  std::vector<gradwire::tensor_view<float>> gradient_views() { return views(grads_); }

  void forward_backward(const batch& d) {
    const auto g = gradient(shape, std::span<const float>(values_), d);
    std::transform(g.begin(), g.end(), grads_.begin(), [](double v) { return float(v); });
  }

  // The same, handing each gradient to on_gradient(i, view) in the order a backward pass
  // produces them (the last layer's first), as an autograd hook would.
  template <class OnGradient>
  void backward(const batch& d, OnGradient&& on_gradient) {
    forward_backward(d);
    const auto g = views(grads_);
    for (std::size_t i = g.size(); i-- > 0;) on_gradient(i, g[i]);
  }

  const std::vector<float>& values() const { return values_; }

  // Where Model(seed) starts, as the float values it holds, widened to double.
  static std::vector<double> initial_values(unsigned seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> normal(0.0, 0.1);
    std::vector<double> v(shape.parameters());
    for (auto& x : v) x = double(float(normal(gen)));
    return v;
  }

  // The final parameters of every model destroyed so far, in the order they were destroyed.
  static std::vector<std::vector<float>> take_finished() {
    const std::lock_guard<std::mutex> lock(mutex());
    return std::exchange(finished(), {});
  }

 private:
  static std::vector<gradwire::tensor_view<float>> views(std::vector<float>& v) {
    return {gradwire::tensor_view<float>(v.data(), gradwire::shape{shape.outputs, shape.inputs}),
            gradwire::tensor_view<float>(v.data() + shape.weights(), gradwire::shape{shape.outputs})};
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::vector<float>>& finished() {
    static std::vector<std::vector<float>> f;
    return f;
  }

  std::vector<float> values_, grads_;  // [W, b]
};

// --- float64 references of the optimizers (PyTorch's formulas, as gradwire's kernels) ----
struct reference_sgd {
  double lr;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
  }
};

struct reference_momentum {
  double lr, momentum;
  std::vector<double> velocity;
  reference_momentum(double lr, double momentum) : lr(lr), momentum(momentum) {}
  void step(std::vector<double>& p, const std::vector<double>& g) {
    velocity.resize(p.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      velocity[i] = momentum * velocity[i] + g[i];
      p[i] -= lr * velocity[i];
    }
  }
};

struct reference_adam {
  double lr, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::vector<double> m, v;
  long t = 0;
  explicit reference_adam(double lr = 1e-3) : lr(lr) {}
  void step(std::vector<double>& p, const std::vector<double>& g) {
    m.resize(p.size(), 0.0);
    v.resize(p.size(), 0.0);
    ++t;
    const double bc1 = 1 - std::pow(beta1, double(t)), bc2 = 1 - std::pow(beta2, double(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + eps);
    }
  }
};

// One device, float64, trained on the whole global batches: what synchronous replicas reproduce.
template <class Optimizer>
std::vector<double> reference_training(layer shape, std::vector<double> p, const std::vector<batch>& global,
                                       Optimizer optimizer) {
  for (const auto& d : global) optimizer.step(p, gradient(shape, std::span<const double>(p), d));
  return p;
}

// Local SGD in float64: each replica steps on its own shard with its own optimizer; after
// every `period` steps the parameters (and, with average_state, the optimizer's buffers)
// are replaced by their mean over the replicas. Returns the replicas' final parameters.
inline void average_state(std::vector<reference_sgd>&) {}
inline void average_state(std::vector<reference_momentum>& replicas) {
  for (std::size_t i = 0; i < replicas.front().velocity.size(); ++i) {
    double mean = 0;
    for (auto& r : replicas) mean += r.velocity[i] / double(replicas.size());
    for (auto& r : replicas) r.velocity[i] = mean;
  }
}
inline void average_state(std::vector<reference_adam>& replicas) {
  for (std::size_t i = 0; i < replicas.front().m.size(); ++i) {
    double m = 0, v = 0;
    for (auto& r : replicas) m += r.m[i] / double(replicas.size()), v += r.v[i] / double(replicas.size());
    for (auto& r : replicas) r.m[i] = m, r.v[i] = v;
  }
}
template <class Optimizer>
std::vector<std::vector<double>> reference_local_sgd(layer shape, const std::vector<double>& start,
                                                     const std::vector<batch>& global, int replicas, int period,
                                                     Optimizer optimizer, bool average_optimizer_state) {
  std::vector<std::vector<double>> p(std::size_t(replicas), start);
  std::vector<Optimizer> optimizers(std::size_t(replicas), optimizer);
  std::vector<std::vector<batch>> shards;
  for (int r = 0; r < replicas; ++r) shards.push_back(shard(shape, global, r, replicas));
  for (std::size_t step = 1; step <= global.size(); ++step) {
    for (std::size_t r = 0; r < p.size(); ++r)
      optimizers[r].step(p[r], gradient(shape, std::span<const double>(p[r]), shards[r][step - 1]));
    if (step % std::size_t(period) != 0) continue;
    for (std::size_t i = 0; i < start.size(); ++i) {
      double mean = 0;
      for (auto& q : p) mean += q[i] / double(replicas);
      for (auto& q : p) q[i] = mean;
    }
    if (average_optimizer_state) average_state(optimizers);
  }
  return p;
}

// --- checks: a program counts its failures and returns non-zero if there were any -------
inline int& failures() {
  static int count = 0;
  return count;
}

// |got - want| <= tolerance * (1 + |want|) element by element.
template <class T>
bool expect_close(const std::string& what, std::span<const T> got, std::span<const double> want, double tolerance) {
  double worst = 0;
  std::size_t at = 0;
  bool ok = got.size() == want.size();
  for (std::size_t i = 0; ok && i < got.size(); ++i) {
    const double error = std::abs(double(got[i]) - want[i]) / (1 + std::abs(want[i]));
    if (!(error <= worst)) worst = error, at = i;  // NaN counts as the worst
  }
  ok = ok && worst <= tolerance;
  if (!ok) {
    ++failures();
    if (got.size() != want.size())
      std::fprintf(stderr, "FAILED %s: %zu values, expected %zu\n", what.c_str(), got.size(), want.size());
    else
      std::fprintf(stderr, "FAILED %s: element %zu is %.9g, expected %.9g (relative error %.3g > %.3g)\n",
                   what.c_str(), at, double(got[at]), want[at], worst, tolerance);
  }
  return ok;
}

inline bool expect(const std::string& what, bool condition) {
  if (!condition) {
    ++failures();
    std::fprintf(stderr, "FAILED %s\n", what.c_str());
  }
  return condition;
}

// main's return value: 0 when every check passed.
inline int report(const char* program, unsigned seed) {
  if (failures() == 0) {
    std::printf("%s: every check passed\n", program);
    return 0;
  }
  std::fprintf(stderr, "%s: %d check(s) failed (seed %u)\n", program, failures(), seed);
  return 1;
}

// For the in-process snippets, once run_inproc has joined the replicas (and so destroyed
// their Models): all `replicas` finished, they hold the same bits, and each follows one
// device in float64 on the whole global batches (Model(seed)'s start), within `tolerance`.
template <class Reference>
void expect_replicas_follow(const std::string& what, int replicas, unsigned seed, const std::vector<batch>& global,
                            Reference reference, double tolerance) {
  const auto done = Model::take_finished();
  const auto want = reference_training(Model::shape, Model::initial_values(seed), global, std::move(reference));
  const std::size_t rows = global.empty() ? 0 : global.front().rows;
  expect(what + ": " + std::to_string(replicas) + " replicas finished (" + std::to_string(done.size()) + " did)",
         done.size() == std::size_t(replicas));
  for (const auto& got : done) {
    expect(what + ": replicas are bit-identical", got == done.front());
    expect_close(what + ": " + std::to_string(replicas) + " replicas of batch " +
                     std::to_string(rows / std::size_t(replicas)) + " against one device (float64) with batch " +
                     std::to_string(rows),
                 std::span<const float>(got), std::span<const double>(want), tolerance);
  }
}

// For the multi-process snippets, once the strategy is built: trains `model` on this
// rank's shard of 8 global batches (4 rows per replica) and checks the result against
// one device in float64 on the global batches (what synchronous strategies reproduce).
template <class Strategy, class Reference>
void train_and_check(const std::string& what, Model& model, Strategy& strategy, unsigned seed, Reference reference) {
  const int replicas = strategy.size();
  const auto global = make_batches(Model::shape, 8, 4 * std::size_t(replicas), seed + 1);
  for (const auto& d : shard(Model::shape, global, strategy.rank(), replicas)) {
    model.forward_backward(d);
    strategy.step(model.gradient_views());
  }
  const auto want = reference_training(Model::shape, Model::initial_values(seed), global, std::move(reference));
  expect_close(what + ": " + std::to_string(replicas) + " ranks against one device (float64) with the global batch",
               std::span<const float>(model.values()), std::span<const double>(want), 1e-4);
}

// A seed every rank of a multi-process job agrees on, fresh for every launch: derived from
// the job token the launcher hands every rank (a fixed one without a launcher).
inline unsigned job_seed() {
  const char* token = std::getenv("GRADWIRE_JOB_TOKEN");
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = token ? token : "snippets"; *c; ++c) h = (h ^ std::uint8_t(*c)) * 1099511628211ull;
  return unsigned(h ^ (h >> 32));
}

}  // namespace snippets
