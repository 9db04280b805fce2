// Gradient accumulation (no_sync micro-batches) and the zero gradient of a tensor marked unused.
//
// K micro-batch steps add their gradients up here, tensor by tensor, and communicate
// nothing; the next synchronised step hands the aggregation the mean of its own gradient
// and the K accumulated ones (K micro-batches of b samples then equal one step with a
// batch of K*b). The sums live in one flat buffer (flat_layout), allocated at the first
// micro-batch and reused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "../tensor/aligned_buffer.hpp"
#include "../tensor/flat_layout.hpp"

namespace gradwire {

// Tag of a micro-batch step (gradient accumulation, PyTorch DDP's no_sync): the gradients
// are added up locally and nothing is communicated or applied; the next synchronised step
// communicates once, with the mean of its own and the accumulated micro-batches'
// gradients (K micro-batches of b samples then equal one step with a batch of K*b).
struct no_sync_t {
  explicit constexpr no_sync_t() = default;
};
inline constexpr no_sync_t no_sync{};

namespace training {

// The running sums of one replica's micro-batches, per parameter tensor, over V.
template <class V>
class accumulation {
 public:
  accumulation() = default;
  // For parameter tensors the sizes of `parameters` (anything with size()), in that order.
  template <class Tensors>
  explicit accumulation(const Tensors& parameters) : layout_(flat_layout::of(parameters)) {}

  // Micro-batches accumulated since the last synchronised step.
  std::size_t micro_batches() const noexcept { return micro_batches_; }

  // A micro-batch's gradient of tensor i: the first of a round starts the sum.
  void add(std::size_t i, std::span<const V> grad) {
    const std::span<V> sum = sums(i);
    if (micro_batches_ == 0)
      std::copy(grad.begin(), grad.end(), sum.begin());
    else
      for (std::size_t k = 0; k < grad.size(); ++k) sum[k] += grad[k];
  }
  // The synchronised step after K micro-batches: the mean of the K + 1 gradients.
  std::span<const V> fold(std::size_t i, std::span<const V> grad) {
    const std::span<V> sum = sums(i);
    const V scale = V(1) / static_cast<V>(micro_batches_ + 1);
    for (std::size_t k = 0; k < grad.size(); ++k) sum[k] = (sum[k] + grad[k]) * scale;
    return sum;
  }
  // A micro-batch step finished; a synchronised one took the sums (fold); a step was given
  // up (its micro-batches go with it).
  void micro_batch_done() noexcept { ++micro_batches_; }
  void folded() noexcept { micro_batches_ = 0; }
  void discard() noexcept { micro_batches_ = 0; }

  // The gradient of a tensor marked unused: zeros, allocated once for the largest tensor.
  std::span<const V> zeros(std::size_t i) {
    if (zeros_.empty()) {
      std::size_t largest = 1;
      for (std::size_t t = 0; t < layout_.tensor_count(); ++t) largest = std::max(largest, layout_.size(t));
      zeros_.assign(largest, V(0));
    }
    return {zeros_.data(), layout_.size(i)};
  }

 private:
  std::span<V> sums(std::size_t i) {
    if (buffer_.size() == 0) buffer_.reserve_discard(layout_.total());
    const std::span<V> all(buffer_.data(), layout_.total());
    return layout_.slice(all, i);
  }

  std::size_t micro_batches_ = 0;
  flat_layout layout_;
  aligned_buffer<V> buffer_;
  std::vector<V> zeros_;
};

}  // namespace training
}  // namespace gradwire
