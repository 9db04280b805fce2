// Tutorial: a user-written compressor (top-k), composed with the library's error feedback and compressed all-reduce.
//
// topk_codec is user code: it lives here, not in include/, and uses only gradwire's public
// headers. It satisfies concepts::compressor<topk_codec, V> with kind gathered: a buffer of
// n elements travels as its k = ceil(density n) largest-magnitude entries, as
// (uint32 index, value) pairs. The library does the rest: compress::error_feedback<> keeps
// what each step left out for the next, and aggregation::compressed_all_reduce<> all-gathers
// every rank's payload and adds them in rank order, bucket by bucket. main() trains a
// least-squares problem on 4 replicas (threads over transport::inproc) with it and with the
// library's dense aggregation::all_reduce, and checks against a float64 serial reference that:
//   (a) at density 1 it follows the dense all-reduce (and the reference) to float rounding
//       at every step;
//   (b) at density 0.01 with error feedback it reaches nearly the dense run's loss while
//       sending a small fraction of its bytes, and without error feedback it is far worse;
//   (c) every replica holds bit-identical parameters after every step.
// Exits non-zero when a check fails. See docs/tutorial.md.
#include <algorithm>
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
#include <utility>
#include <vector>

#include <gradwire/aggregation/compressed_all_reduce.hpp>
#include <gradwire/compress/error_feedback.hpp>
#include <gradwire/gradwire.hpp>

#include "least_squares.hpp"

namespace gw = gradwire;

// [docs:topk_class]
// Top-k sparsification (Stich et al. 2018; Lin et al., "Deep Gradient Compression", 2018):
// a buffer of n elements travels as its k = ceil(density * n) largest-magnitude entries,
// as (index, value) pairs; the others read as zero. The sum of two ranks' top-k's is not a
// top-k, so it cannot be re-encoded hop by hop on a ring: the kind is `gathered`, every
// rank's payload reaches every rank, and each adds them all up in rank order.
class topk_codec {
 public:
  static constexpr gw::concepts::compression_kind kind = gw::concepts::compression_kind::gathered;

  explicit topk_codec(double density = 0.01) : density_(density) {
    if (!(density > 0.0 && density <= 1.0))
      throw gw::error(gw::errc::invalid_argument,
                      "topk_codec: density must be in (0, 1], got " + std::to_string(density));
  }

  // k for a buffer of n elements: at least 1, at most n.
  std::size_t k(std::size_t n) const {
    if (n == 0) return 0;
    const auto wanted = static_cast<std::size_t>(std::ceil(density_ * static_cast<double>(n)));
    return std::clamp<std::size_t>(wanted, 1, n);
  }

  // A pair is a uint32 index, then the value. The payload's size depends on n alone (and
  // the density, the same on every rank), so every rank knows the size of every payload.
  template <class V>
  static constexpr std::size_t pair_bytes = sizeof(std::uint32_t) + sizeof(V);
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const {
    return k(n) * pair_bytes<V>;
  }

  // The per-buffer state: the selection's index array, allocated once so that no encode
  // allocates. (The residual of error feedback is not here: error_feedback<> adds its own.)
  template <class V>
  struct state {
    std::vector<std::uint32_t> order;
  };
  template <class V>
  state<V> init(std::size_t n) const {
    if (n > std::numeric_limits<std::uint32_t>::max())
      throw gw::error(gw::errc::invalid_argument, "topk_codec: a buffer of " + std::to_string(n) +
                                                      " elements is too large for 32-bit indices; use smaller buckets");
    return {std::vector<std::uint32_t>(n)};
  }
  // [/docs:topk_class]

  // [docs:topk_encode]
  // This rank's buffer: std::nth_element moves the k largest |in[j]| to the front in O(n).
  // NaN counts as the largest magnitude, so that the comparison stays a strict weak order
  // (and a NaN gradient is sent, not hidden).
  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    const std::size_t n = in.size(), kept = k(n);
    if (s.order.size() != n || out.size() != encoded_bytes<V>(n))
      throw gw::error(gw::errc::invalid_argument, "topk_codec: encode of " + std::to_string(n) +
                                                      " elements with a state or payload sized for another length");
    const auto magnitude = [&](std::uint32_t j) {
      const V m = std::abs(in[j]);
      return std::isnan(m) ? std::numeric_limits<V>::infinity() : m;
    };
    std::iota(s.order.begin(), s.order.end(), std::uint32_t{0});
    std::nth_element(s.order.begin(), s.order.begin() + static_cast<std::ptrdiff_t>(kept), s.order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return magnitude(a) > magnitude(b); });
    for (std::size_t q = 0; q < kept; ++q) {  // payload bytes have no alignment: memcpy
      std::byte* pair = out.data() + q * pair_bytes<V>;
      std::memcpy(pair, &s.order[q], sizeof(std::uint32_t));
      std::memcpy(pair + sizeof(std::uint32_t), &in[s.order[q]], sizeof(V));
    }
  }
  // [/docs:topk_encode]

  // [docs:topk_decode]
  // From the payload alone: any rank's payload decodes to the same bits on every rank, so
  // ranks that add the same payloads in the same order (compressed_all_reduce: rank order)
  // hold the same sum.
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    std::fill(out.begin(), out.end(), V(0));
    decode_add(in, out);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    const std::size_t n = inout.size();
    if (in.size() != encoded_bytes<V>(n))
      throw gw::error(gw::errc::invalid_argument, "topk_codec: a payload of " + std::to_string(in.size()) +
                                                      " bytes for " + std::to_string(n) + " elements, which take " +
                                                      std::to_string(encoded_bytes<V>(n)));
    for (std::size_t q = 0; q < k(n); ++q) {
      std::uint32_t j;
      V value;
      std::memcpy(&j, in.data() + q * pair_bytes<V>, sizeof(std::uint32_t));
      std::memcpy(&value, in.data() + q * pair_bytes<V> + sizeof(std::uint32_t), sizeof(V));
      if (j >= n)
        throw gw::error(gw::errc::invalid_argument, "topk_codec: a payload names element " + std::to_string(j) +
                                                        " of " + std::to_string(n) +
                                                        " (does every rank use the same density?)");
      inout[j] += value;
    }
  }
  // [/docs:topk_decode]

 private:
  double density_;
};

// [docs:topk_concept_check]
static_assert(gw::concepts::compressor<topk_codec, float> && gw::concepts::compressor<topk_codec, double>);
// [/docs:topk_concept_check]

// [docs:topk_compose]
// The library's reusable parts do the rest. error_feedback<Codec> keeps this rank's residual
// (what encode left out, added to the next input) in the per-buffer state, around any
// linear or gathered codec; compressed_all_reduce<Codec> is all_reduce's bucketed
// aggregation with the codec on the wire (for a gathered codec: an all-gather of the
// payloads, decode_add-ed in rank order).
using topk_feedback = gw::compress::error_feedback<topk_codec>;
using sparse_all_reduce = gw::aggregation::compressed_all_reduce<topk_feedback>;
using sparse_all_reduce_no_feedback = gw::aggregation::compressed_all_reduce<topk_codec>;
static_assert(gw::concepts::aggregation<sparse_all_reduce, float, gw::transport::inproc>);
// [/docs:topk_compose]

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
    const auto dense = train(data, [] { return gw::aggregation::all_reduce(); });
    const auto topk_full = train(data, [] { return sparse_all_reduce(topk_feedback(topk_codec(1.0))); });
    const auto topk_10 = train(data, [] { return sparse_all_reduce(topk_feedback(topk_codec(0.1))); });
    const auto topk_1 = train(data, [] { return sparse_all_reduce(topk_feedback(topk_codec(0.01))); });
    const auto topk_1_no_feedback = train(data, [] { return sparse_all_reduce_no_feedback(topk_codec(0.01)); });
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
    std::printf("| aggregation, codec | density | error feedback | final loss | bytes sent per step per replica | "
                "vs dense |\n");
    std::printf("|---|---|---|---|---|---|\n");
    auto row = [&](const char* name, const char* density, const char* feedback, double loss, double bytes) {
      std::printf("| %s | %s | %s | %.3e | %.0f | %.1f%% |\n", name, density, feedback, loss, bytes,
                  100.0 * bytes / dense.bytes_per_step);
    };
    row("all_reduce (dense)", "1", "-", l_dense, dense.bytes_per_step);
    row("compressed_all_reduce, topk_codec", "1", "on", l_full, topk_full.bytes_per_step);
    row("compressed_all_reduce, topk_codec", "0.1", "on", l_10, topk_10.bytes_per_step);
    row("compressed_all_reduce, topk_codec", "0.01", "on", l_1, topk_1.bytes_per_step);
    row("compressed_all_reduce, topk_codec", "0.01", "off", l_1_nf, topk_1_no_feedback.bytes_per_step);
    std::printf("\n%.1f s, %d failed check(s)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topk_compressor: %s\n", e.what());
    return 1;
  }
}
