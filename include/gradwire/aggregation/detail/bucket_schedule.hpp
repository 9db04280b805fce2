// The buckets of an agent that communicates while backward still runs: which bucket goes out when.
//
// Gradients are placed in a flat buffer in the order backward is expected to produce them
// (reverse parameter order at first, then the order rank 0 saw in the first step: PyTorch
// DDP's rebuild), cut into buckets of a byte budget. ready(i, grad) copies the gradient
// into its slice; a bucket whose last tensor is in goes out, but only after every bucket
// before it, so that every rank starts the same collectives in the same order whatever
// order its own gradients come in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../../collective/broadcast.hpp"
#include "../../collective/bucketing.hpp"
#include "../../collective/communicator.hpp"
#include "../../config.hpp"
#include "../../error.hpp"
#include "../../tensor/aligned_buffer.hpp"
#include "../../tensor/flat_layout.hpp"

namespace gradwire::aggregation::detail {

template <class V>
class bucket_schedule {
 public:
  explicit bucket_schedule(std::size_t budget_bytes) : budget_(budget_bytes) {
    if (budget_ == 0) throw error(errc::invalid_argument, "aggregation: the bucket budget must be positive");
  }

  std::size_t budget_bytes() const noexcept { return budget_; }

  // Plans for tensors of `sizes`, in reverse index order (the order backward produces them).
  void plan(std::span<const std::size_t> sizes) {
    std::vector<std::size_t> order(sizes.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
    plan(sizes, order);
  }
  void plan(std::span<const std::size_t> sizes, std::span<const std::size_t> order) {
    layout_ = flat_layout(sizes, order);
    std::vector<std::size_t> in_order;
    for (std::size_t i : layout_.order()) in_order.push_back(layout_.size(i));
    collective::plan_buckets(in_order, sizeof(V), budget_, buckets_);
    bucket_of_.assign(sizes.size(), 0);
    for (std::size_t k = 0; k < buckets_.size(); ++k)
      for (std::size_t p = buckets_[k].first_tensor; p < buckets_[k].end_tensor; ++p) bucket_of_[layout_.order()[p]] = k;
    missing_.assign(buckets_.size(), 0);
    // Allocated and touched now (first touch of fresh memory is slow here), not in a step.
    flat_.reserve_discard(layout_.total());
    std::fill_n(flat().data(), layout_.total(), V(0));
    observed_.clear();
    observed_.reserve(sizes.size());
  }

  const flat_layout& layout() const noexcept { return layout_; }
  // Bucket k holds the tensors at flat positions [first_tensor, end_tensor) of layout().order().
  std::span<const collective::bucket> buckets() const noexcept { return buckets_; }
  std::span<V> flat() noexcept { return {flat_.data(), layout_.total()}; }
  std::span<V> flat(const collective::bucket& b) noexcept { return flat().subspan(b.offset, b.count); }
  std::span<V> slice(std::size_t i) noexcept { return layout_.slice(flat(), i); }

  // A step starts: every bucket waits for all of its tensors again.
  void begin_step() {
    for (std::size_t k = 0; k < buckets_.size(); ++k) missing_[k] = buckets_[k].end_tensor - buckets_[k].first_tensor;
    next_ = 0;
    if (!rebuilt_) observed_.clear();  // the order of this step only
  }

  // Gradient i is final: copy it into its slice, then launch(k) each bucket that may go
  // now, in bucket order.
  template <class Launch>
  void ready(std::size_t i, std::span<const V> grad, Launch&& launch) {
    const std::span<V> to = slice(i);
    std::copy(grad.begin(), grad.end(), to.begin());
    if (!rebuilt_) observed_.push_back(i);
    --missing_[bucket_of_[i]];
    while (next_ < buckets_.size() && missing_[next_] == 0) launch(next_++);
  }

  // After the first step (collective, every rank calls it at the same point): adopt the
  // order in which rank 0's gradients came and plan again, once. Ranks may have seen
  // different orders (threads); rank 0's is the one all of them use.
  template <class Tr>
  void rebuild_once(collective::communicator<Tr>& comm) {
    if (rebuilt_) return;
    rebuilt_ = true;
    const std::size_t n = layout_.tensor_count();
    std::vector<double> order(n, 0.0);  // indices travel exactly as doubles (below 2^53)
    if (comm.rank() == 0) {
      for (std::size_t k = 0; k < n && k < observed_.size(); ++k) order[k] = static_cast<double>(observed_[k]);
      if (observed_.size() != n && n > 0) order[0] = -1.0;  // rank 0 saw no whole step: keep the plan
    }
    collective::broadcast(comm, std::span<double>(order), 0);
    if (n > 0 && order[0] < 0) return;
    std::vector<std::size_t> adopted(n);
    for (std::size_t k = 0; k < n; ++k) adopted[k] = static_cast<std::size_t>(order[k]);
    if (std::equal(adopted.begin(), adopted.end(), layout_.order().begin(), layout_.order().end())) return;
    std::vector<std::size_t> sizes(n);
    for (std::size_t i = 0; i < n; ++i) sizes[i] = layout_.size(i);
    plan(sizes, adopted);
  }
  bool rebuilt() const noexcept { return rebuilt_; }

 private:
  std::size_t budget_;
  flat_layout layout_;
  std::vector<collective::bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // [tensor]
  std::vector<std::size_t> missing_;    // [bucket]: tensors not ready yet this step
  std::size_t next_ = 0;                // the next bucket to launch
  std::vector<std::size_t> observed_;   // the order ready() saw in the first step
  bool rebuilt_ = false;
  aligned_buffer<V> flat_;
};

#if !GRADWIRE_HEADER_ONLY  // compiled once, in src/core.cpp (config.hpp)
extern template class bucket_schedule<float>;
extern template class bucket_schedule<double>;
#endif

}  // namespace gradwire::aggregation::detail
