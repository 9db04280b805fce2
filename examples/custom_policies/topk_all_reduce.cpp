// Tutorial: a user-written aggregation, top-k sparsified all-reduce with error feedback.
//
// topk_all_reduce is user code: it lives here, not in include/, and uses only gradwire's
// public headers. main() trains a least-squares problem on 4 replicas (threads over
// transport::inproc) with it and with the library's dense aggregation::all_reduce, and
// checks against a float64 serial reference that:
//   (a) at density 1 it follows the dense all-reduce (and the reference) to float rounding
//       at every step;
//   (b) at density 0.01 with error feedback it reaches nearly the dense run's loss while
//       sending a small fraction of its bytes, and without error feedback it is far worse;
//   (c) every replica holds bit-identical parameters after every step.
// Exits non-zero when a check fails. See docs/tutorial.md.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradwire/gradwire.hpp>

#include "least_squares.hpp"

namespace gw = gradwire;

// [docs:topk_class]
// Top-k sparsified all-reduce with error feedback (Stich et al. 2018; Lin et al., "Deep
// Gradient Compression", 2018). Each replica adds the residual it kept from earlier
// steps to its gradient, sends only the k largest-magnitude entries of each tensor as
// (index, value) pairs, and keeps the rest as the next residual. The replicas all-gather
// every replica's pairs, sum them into a dense gradient and apply it with scale 1/N, so
// all replicas take the same step and stay identical.
//   V: the tensors' value_type (float or double)
template <class V>
class topk_all_reduce {
 public:
  struct options {
    double density = 0.01;       // fraction of each tensor's entries sent per step, in (0, 1]
    bool error_feedback = true;  // carry what was not sent over to the next step
  };

  explicit topk_all_reduce(options o = {}) : options_(o) {
    if (!(o.density > 0.0 && o.density <= 1.0))
      throw gw::error(gw::errc::invalid_argument,
                      "topk_all_reduce: density must be in (0, 1], got " + std::to_string(o.density));
  }

  // Parameters change only through apply(), as in aggregation::all_reduce (a hint that
  // strategy<> reads for device replicas).
  static constexpr bool updates_only_through_apply = true;
  // [/docs:topk_class]

  // [docs:topk_setup]
  // Replicas start from rank 0's parameters. Every buffer a step needs is sized here,
  // once, from the tensors' sizes (the same on every rank), so no step allocates.
  template <class Tr>
  void setup(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    tensors_.clear();
    residuals_.clear();
    std::size_t pairs = 0, largest = 0;
    for (auto p : params) {
      if (p.size() > std::numeric_limits<index_type>::max())
        throw gw::error(gw::errc::invalid_argument, "topk_all_reduce: a tensor of " + std::to_string(p.size()) +
                                                        " elements is too large for its index type");
      const std::size_t keep = keep_count(p.size());
      tensors_.push_back({p.size(), keep, pairs});
      residuals_.emplace_back(p.size(), V(0));
      pairs += keep;
      largest = std::max(largest, p.size());
      gw::collective::broadcast(comm, p, 0);
    }
    order_.resize(largest);
    sum_.resize(largest);
    // All replicas' pairs, flattened as [index, value, index, value, ...]: 2 * pairs
    // elements per rank, so chunk_of(gathered_, N, r) is exactly rank r's share.
    gathered_.assign(2 * pairs * static_cast<std::size_t>(comm.size()), V(0));
  }
  // [/docs:topk_setup]

  // [docs:topk_step]
  template <class Tr, class Apply>
  void step(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>>,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    const int ranks = comm.size();
    const std::span<V> gathered(gathered_);
    // 1. Choose this replica's pairs for every tensor into its chunk of the buffer.
    const std::span<V> mine = gw::collective::chunk_of(gathered, ranks, comm.rank());
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      compress(i, grads[i], mine.subspan(2 * tensors_[i].first_pair, 2 * tensors_[i].keep));
    // 2. One collective per step for all tensors: every replica gets every replica's pairs.
    gw::collective::all_gather(comm, gathered);
    // 3. Sum the sparse contributions densely, in rank order (the same on every replica,
    //    so the sums are bit-identical), and let the optimizer apply their mean.
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const tensor_plan& t = tensors_[i];
      const std::span<V> sum(sum_.data(), t.size);
      std::fill(sum.begin(), sum.end(), V(0));
      for (int r = 0; r < ranks; ++r) {
        const auto theirs = gw::collective::chunk_of(gathered, ranks, r).subspan(2 * t.first_pair, 2 * t.keep);
        for (std::size_t q = 0; q < t.keep; ++q) {
          const auto j = std::bit_cast<index_type>(theirs[2 * q]);
          if (j >= t.size)
            throw gw::error(gw::errc::protocol, "topk_all_reduce: rank " + std::to_string(r) + " sent index " +
                                                    std::to_string(j) + " for a tensor of " + std::to_string(t.size));
          sum[j] += theirs[2 * q + 1];
        }
      }
      apply(i, std::span<const V>(sum), V(1) / static_cast<V>(ranks));
    }
  }
  // [/docs:topk_step]

 private:
  // Indices travel through all_gather (which moves float/double elements) bit-cast to V:
  // all_gather only copies, so the bits arrive unchanged.
  using index_type = std::conditional_t<sizeof(V) == 4, std::uint32_t, std::uint64_t>;
  static_assert(sizeof(index_type) == sizeof(V));

  struct tensor_plan {
    std::size_t size;        // elements
    std::size_t keep;        // k: pairs sent per step
    std::size_t first_pair;  // offset of this tensor's pairs in a rank's chunk
  };

  std::size_t keep_count(std::size_t n) const {
    if (n == 0) return 0;
    const auto k = static_cast<std::size_t>(std::ceil(options_.density * static_cast<double>(n)));
    return std::clamp<std::size_t>(k, 1, n);
  }

  // [docs:topk_compress]
  // Writes tensor i's k pairs into `out`; with error feedback the residual first takes in
  // the gradient (residual += grad: what this replica owes the others), the k largest
  // entries are sent and zeroed, and the rest stays owed for later steps.
  void compress(std::size_t i, std::span<const V> grad, std::span<V> out) {
    const tensor_plan& t = tensors_[i];
    std::vector<V>& residual = residuals_[i];
    std::span<const V> candidates = grad;
    if (options_.error_feedback) {
      for (std::size_t j = 0; j < t.size; ++j) residual[j] += grad[j];
      candidates = residual;
    }
    const std::span<index_type> order(order_.data(), t.size);
    std::iota(order.begin(), order.end(), index_type(0));
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(t.keep), order.end(),
                     [&](index_type a, index_type b) { return std::abs(candidates[a]) > std::abs(candidates[b]); });
    for (std::size_t q = 0; q < t.keep; ++q) {
      const index_type j = order[q];
      out[2 * q] = std::bit_cast<V>(j);
      out[2 * q + 1] = candidates[j];
      if (options_.error_feedback) residual[j] = V(0);
    }
  }
  // [/docs:topk_compress]

  options options_;
  std::vector<tensor_plan> tensors_;
  std::vector<std::vector<V>> residuals_;  // error feedback, one per tensor
  std::vector<index_type> order_;          // selection scratch
  std::vector<V> sum_;                     // the dense sum of one tensor
  std::vector<V> gathered_;                // every replica's pairs
};

// [docs:topk_concept_check]
static_assert(gw::concepts::aggregation<topk_all_reduce<float>, float, gw::transport::inproc>);
static_assert(gw::concepts::aggregation<topk_all_reduce<double>, double, gw::transport::inproc>);
// [/docs:topk_concept_check]


namespace {

constexpr int ranks = 4;
constexpr std::size_t features = 1000;  // w: 1000 weights, plus a bias tensor of 1
constexpr std::size_t samples_per_rank = 1000;
constexpr int steps = 400;
constexpr double lr = 0.1;

using problem = tutorial::least_squares;

// Parameters after each step, flattened (w, then b).
using trajectory = std::vector<std::vector<float>>;

struct run_result {
  std::vector<trajectory> per_rank;  // [rank][step]
  double bytes_per_step = 0;         // mean over ranks of the bytes each sent per step
};

// Trains on `ranks` threads, each replica with the aggregation make() returns; rank r > 0
// starts from garbage, so the aggregation's setup must make replicas equal.
template <class Make>
run_result train(const problem& data, Make make) {
  using Aggregation = decltype(make());
  run_result result;
  result.per_rank.resize(ranks);
  std::vector<std::uint64_t> sent(ranks);  // bytes each rank sent during its steps
  // [docs:topk_train]
  using strategy = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, Aggregation, gw::transport::inproc>;
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    const int r = endpoint.rank();
    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{features});
    params.emplace_back(gw::shape{1});
    for (auto& p : params) std::fill(p.span().begin(), p.span().end(), r == 0 ? 0.0f : 100.0f + float(r));
    // Every blocking step of every collective gives up after 60 s instead of hanging.
    strategy s(endpoint, std::move(params), gw::optim::sgd({.lr = lr}), make(), {.timeout = std::chrono::seconds(60)});
    std::vector<std::vector<float>> grads{std::vector<float>(features), std::vector<float>(1)};
    for (int t = 0; t < steps; ++t) {
      const auto w = s.parameters()[0].span(), b = s.parameters()[1].span();
      data.gradient<float>(r, w, b[0], grads[0], grads[1][0]);
      s.step(grads);
      std::vector<float> now(w.begin(), w.end());
      now.push_back(s.parameters()[1][0]);
      result.per_rank[r].push_back(std::move(now));
    }
    // Counted by the transport (inproc is a concepts::metered_transport), step by step.
    sent[r] = s.cumulative_stats().traffic.bytes_sent;
  });
  // [/docs:topk_train]
  for (int r = 0; r < ranks; ++r) result.bytes_per_step += double(sent[r]) / steps / ranks;
  return result;
}

template <class A, class B>
double max_difference(const std::vector<A>& a, const std::vector<B>& b) {
  double worst = 0;
  for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::abs(double(a[j]) - double(b[j])));
  return worst;
}

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

// (c): every replica's parameters equal rank 0's, bit for bit, after every step.
void check_replicas_identical(const run_result& run, const std::string& name) {
  int first_bad_step = -1, bad_rank = -1;
  for (int r = 1; r < ranks && first_bad_step < 0; ++r)
    for (int t = 0; t < steps; ++t)
      if (std::memcmp(run.per_rank[r][t].data(), run.per_rank[0][t].data(), sizeof(float) * (features + 1)) != 0) {
        first_bad_step = t, bad_rank = r;
        break;
      }
  std::string what = name + ": all " + std::to_string(ranks) + " replicas hold identical parameters after every step";
  if (first_bad_step >= 0)
    what += " (rank " + std::to_string(bad_rank) + " differs at step " + std::to_string(first_bad_step + 1) + ")";
  check(first_bad_step < 0, what);
}

double final_loss(const problem& data, const run_result& run) {
  const auto& last = run.per_rank[0].back();
  return data.loss(std::span<const float>(last.data(), features), last[features]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::uint32_t seed = argc > 1 ? static_cast<std::uint32_t>(std::stoul(argv[1])) : 2024u;
    const auto started = std::chrono::steady_clock::now();
    const problem data(ranks, features, samples_per_rank, seed);
    const auto ref = data.reference(lr, steps);

    // [docs:topk_use]
    using topk = topk_all_reduce<float>;
    const auto dense = train(data, [] { return gw::aggregation::all_reduce(); });
    const auto topk_full = train(data, [] { return topk({.density = 1.0}); });
    const auto topk_10 = train(data, [] { return topk({.density = 0.1}); });
    const auto topk_1 = train(data, [] { return topk({.density = 0.01}); });
    const auto topk_1_no_feedback = train(data, [] { return topk({.density = 0.01, .error_feedback = false}); });
    // [/docs:topk_use]

    // (a) Density 1 sends everything: the same steps as the dense all-reduce, up to the
    // order of the float additions, at every step. Both are compared with the float64
    // reference; the bound is a few hundred float ulps of parameters of size ~0.1-0.5.
    double dense_vs_ref = 0, full_vs_ref = 0, full_vs_dense = 0, scale = 0;
    for (int t = 0; t < steps; ++t) {
      dense_vs_ref = std::max(dense_vs_ref, max_difference(dense.per_rank[0][t], ref[t]));
      full_vs_ref = std::max(full_vs_ref, max_difference(topk_full.per_rank[0][t], ref[t]));
      full_vs_dense = std::max(full_vs_dense, max_difference(topk_full.per_rank[0][t], dense.per_rank[0][t]));
      for (double v : ref[t]) scale = std::max(scale, std::abs(v));
    }
    const double tolerance = 1e-5 * scale;
    std::printf("max |parameter difference| over %d steps (largest parameter %.3f): dense vs float64 %.2e, "
                "top-k(1.0) vs float64 %.2e, top-k(1.0) vs dense %.2e\n",
                steps, scale, dense_vs_ref, full_vs_ref, full_vs_dense);
    check(dense_vs_ref <= tolerance, "dense all_reduce follows the float64 reference at every step");
    check(full_vs_ref <= tolerance, "top-k at density 1 follows the float64 reference at every step");
    check(full_vs_dense <= tolerance, "top-k at density 1 equals the dense all_reduce to float rounding");

    // (b) Sparse: the loss falls almost as far as the dense run's with error feedback, and
    // clearly less far without it, while sending a small fraction of the bytes.
    std::vector<double> ref_last(ref.back());
    const double initial = data.loss(std::span<const float>(std::vector<float>(features, 0.0f)), 0.0f);
    const double reference_loss = data.loss(std::span<const double>(ref_last.data(), features), ref_last[features]);
    const double l_dense = final_loss(data, dense), l_full = final_loss(data, topk_full),
                 l_10 = final_loss(data, topk_10), l_1 = final_loss(data, topk_1),
                 l_1_nf = final_loss(data, topk_1_no_feedback);
    const double gap = initial - l_dense;  // how far the dense run brought the loss down
    check(l_1 - l_dense <= 1e-3 * gap,
          "density 0.01 with error feedback closes >= 99.9% of the loss gap the dense run closes");
    check(l_1_nf - l_dense >= 10 * (l_1 - l_dense) && l_1_nf - l_dense >= 1e-2 * gap,
          "without error feedback, density 0.01 ends >= 10x further from the dense loss (and >= 1% of the gap)");
    check(topk_1.bytes_per_step <= 0.1 * dense.bytes_per_step,
          "density 0.01 sends <= 10% of the dense all-reduce's bytes per step (as the transport counted them)");
    check(topk_10.bytes_per_step < dense.bytes_per_step && topk_1.bytes_per_step < topk_10.bytes_per_step,
          "fewer entries sent, fewer bytes: density 0.01 < 0.1 < dense");

    // (c)
    check_replicas_identical(dense, "dense all_reduce");
    check_replicas_identical(topk_full, "top-k density 1.0");
    check_replicas_identical(topk_10, "top-k density 0.1");
    check_replicas_identical(topk_1, "top-k density 0.01");
    check_replicas_identical(topk_1_no_feedback, "top-k density 0.01, no error feedback");

    std::printf("\n%d replicas, least squares with %zu + 1 parameters, %zu samples per replica, SGD lr %.2f, "
                "%d steps\n",
                ranks, features, samples_per_rank, lr, steps);
    std::printf("initial loss %.6f, float64 reference final loss %.3e\n\n", initial, reference_loss);
    std::printf("| aggregation | density | error feedback | final loss | bytes sent per step per replica | "
                "vs dense |\n");
    std::printf("|---|---|---|---|---|---|\n");
    auto row = [&](const char* name, const char* density, const char* feedback, double loss, double bytes) {
      std::printf("| %s | %s | %s | %.3e | %.0f | %.1f%% |\n", name, density, feedback, loss, bytes,
                  100.0 * bytes / dense.bytes_per_step);
    };
    row("all_reduce (dense)", "1", "-", l_dense, dense.bytes_per_step);
    row("topk_all_reduce", "1", "on", l_full, topk_full.bytes_per_step);
    row("topk_all_reduce", "0.1", "on", l_10, topk_10.bytes_per_step);
    row("topk_all_reduce", "0.01", "on", l_1, topk_1.bytes_per_step);
    row("topk_all_reduce", "0.01", "off", l_1_nf, topk_1_no_feedback.bytes_per_step);
    std::printf("\n%.1f s, %d failed check(s)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topk_all_reduce: %s\n", e.what());
    return 1;
  }
}
