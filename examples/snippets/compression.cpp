// docs/strategies/compression.md's code: the codecs, a parameter-server style push with error feedback, PowerSGD's rounds.
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/compress/codecs.hpp>
#include <gradwire/transport/inproc.hpp>

#include <cmath>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include "snippet_support.hpp"

namespace gw = gradwire;

int main() {
  const unsigned seed = std::random_device{}();
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  {
    // [docs:codecs]
    gw::compress::fp16 half;                                      // 2 bytes an element, within 2^-11
    gw::compress::bf16 brain;                                     // 2 bytes, float's range, within 2^-8
    gw::compress::int8 bytes;                                     // 1 byte + 4 per buffer, within scale/2
    gw::compress::error_feedback<gw::compress::top_k> sparse(
        gw::compress::top_k(0.01));                               // the largest 1%, the rest carried over
    gw::compress::powersgd low_rank({.rank = 2, .start_step = 100});  // 2 r sqrt(n) elements
    // [/docs:codecs]
    snippets::expect("fp16 halves float", half.encoded_bytes<float>(1000) == 2000);
    snippets::expect("bf16 halves float", brain.encoded_bytes<float>(1000) == 2000);
    snippets::expect("int8: a byte an element and the scale", bytes.encoded_bytes<float>(1000) == 1004);
    snippets::expect("top-k 1% of 1000: 10 pairs", sparse.encoded_bytes<float>(1000) == 10 * 8);
    snippets::expect("PowerSGD rank 2 of 1000 (32 x 32): 128 elements", low_rank.encoded_bytes<float>(1000) == 128 * 4);
  }

  {  // A worker pushes three gradients through top-k with error feedback; a server adds them.
    const std::size_t n = 1000;
    std::vector<std::vector<float>> gradients(3, std::vector<float>(n));
    for (auto& g : gradients)
      for (auto& x : g) x = normal(gen);
    std::vector<float> sum(n, 0.0f);
    // [docs:push]
    gw::compress::error_feedback<gw::compress::top_k> codec(gw::compress::top_k(0.01));
    auto state = codec.init<float>(n);  // once per buffer: the residual and scratch allocated here
    std::vector<std::byte> payload(codec.encoded_bytes<float>(n));
    for (const std::vector<float>& gradient : gradients) {
      codec.encode(state, std::span<const float>(gradient), std::span<std::byte>(payload));  // worker
      codec.decode_add(std::span<const std::byte>(payload), std::span<float>(sum));         // server
    }
    // Nothing is lost, only delayed: sum + state.residual == the sum of the gradients.
    // [/docs:push]
    std::vector<double> want(n, 0.0), got(n);
    for (const auto& g : gradients)
      for (std::size_t i = 0; i < n; ++i) want[i] += g[i];
    for (std::size_t i = 0; i < n; ++i) got[i] = double(sum[i]) + double(state.residual.data()[i]);
    snippets::expect_close("top-k with error feedback: what arrived plus the residual is what was sent",
                           std::span<const double>(got), std::span<const double>(want), 1e-5);
  }

  {  // PowerSGD's two rounds over three ranks whose gradients are multiples of one rank-1 matrix.
    const std::size_t n = 600;  // read as 24 x 25 (low_rank::matrix_shape)
    std::vector<float> u(24), v(25);
    for (auto& x : u) x = normal(gen);
    for (auto& x : v) x = normal(gen);
    auto gradient_of = [&](int rank) {
      std::vector<float> g(n);
      for (std::size_t k = 0; k < n; ++k) g[k] = float(rank + 1) * u[k / 25] * v[k % 25];
      return g;
    };
    std::vector<std::vector<float>> results(3);
    gw::transport::run_inproc(3, [&](gw::transport::inproc endpoint) {
      const int me = endpoint.rank();
      gw::collective::communicator comm(endpoint);
      const std::vector<float> gradient = gradient_of(me);
      std::vector<float> sum(n);
      // [docs:powersgd]
      gw::compress::powersgd codec({.rank = 1, .start_step = 0});
      auto state = codec.init<float>(gradient.size());  // M, the residual, P and Q, allocated once
      // Every step, on every rank:
      std::span<float> p = codec.low_rank_begin(state, std::span<const float>(gradient));  // P = M Q
      gw::collective::all_reduce(comm, p);                                                // sum P
      std::span<float> q = codec.low_rank_middle(state);  // orthogonalise P, Q = M^T P
      if (!q.empty()) gw::collective::all_reduce(comm, q);  // sum Q (empty: a plain step)
      codec.low_rank_end(state, std::span<float>(sum));     // sum ~ P Q^T, the same bits everywhere
      // [/docs:powersgd]
      results[static_cast<std::size_t>(me)] = sum;
    });
    std::vector<double> want(n);
    for (std::size_t k = 0; k < n; ++k) want[k] = 6.0 * double(u[k / 25]) * double(v[k % 25]);
    for (const auto& got : results) {
      snippets::expect("PowerSGD: every rank holds the same bits", got == results.front());
      snippets::expect_close("PowerSGD rank 1 of a rank-1 sum, against float64", std::span<const float>(got),
                             std::span<const double>(want), 1e-4);
    }
  }
  return snippets::report("snippet compression", seed);
}
