// Bucketing (tensor fusion): pack many tensors into few flat buffers of a byte budget, reduce, unpack.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../tensor/flat_layout.hpp"
#include "all_reduce.hpp"
#include "communicator.hpp"

namespace gradwire::collective {

// 25 MiB, PyTorch DDP's default: big enough that per-call latency is amortised, small
// enough that several buckets pipeline (communicate one while another is gathered or used).
inline constexpr std::size_t default_bucket_bytes = std::size_t{25} << 20;

// Tensors [first_tensor, end_tensor) packed back to back at elements [offset, offset +
// count) of the flat buffer.
struct bucket {
  std::size_t first_tensor = 0, end_tensor = 0;
  std::size_t offset = 0, count = 0;
};

// Packs tensors of `counts` elements, in order, into buckets of at most `budget_bytes`.
// A tensor larger than the budget gets a bucket of its own and is not split: optimizers
// and the aggregation's apply() take whole tensors. Empty tensors ride along in the
// current bucket. Every tensor is in exactly one bucket; no tensors, no buckets.
inline void plan_buckets(std::span<const std::size_t> counts, std::size_t element_bytes, std::size_t budget_bytes,
                         std::vector<bucket>& out) {
  if (budget_bytes == 0 || element_bytes == 0)
    throw error(errc::invalid_argument, "plan_buckets: the bucket budget and the element size must be positive");
  out.clear();
  bucket current;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::size_t c = counts[i];
    if (current.count > 0 && c > 0 && (current.count + c) > budget_bytes / element_bytes) {
      out.push_back(current);
      current = {i, i, current.offset + current.count, 0};
    }
    current.end_tensor = i + 1;
    current.count += c;
  }
  if (!counts.empty()) out.push_back(current);
}

// A bucket plan and the flat buffer behind it, reused across steps: planned again only
// when the tensors' sizes change, and the buffer (all buckets back to back, so several
// can be in flight at once) grows once and is then reused.
class bucket_buffer {
 public:
  explicit bucket_buffer(std::size_t budget_bytes = default_bucket_bytes) : budget_(budget_bytes) {
    if (budget_ == 0) throw error(errc::invalid_argument, "bucket_buffer: the bucket budget must be positive");
  }

  std::size_t budget_bytes() const noexcept { return budget_; }

  // Plans buckets for `tensors` (a range of spans of V) and returns them.
  template <class V, class Tensors>
  std::span<const bucket> plan(const Tensors& tensors) {
    if (element_bytes_ != sizeof(V) || !layout_.fits(tensors)) {
      layout_ = flat_layout::of(tensors);
      element_bytes_ = sizeof(V);
      std::vector<std::size_t> counts;
      for (const auto& t : tensors) counts.push_back(t.size());
      plan_buckets(counts, sizeof(V), budget_, buckets_);
      flat_.reserve_discard(layout_.total() * sizeof(V));
    }
    return buckets_;
  }

  std::span<const bucket> buckets() const noexcept { return buckets_; }
  const flat_layout& layout() const noexcept { return layout_; }

  // Bucket b's slice of the flat buffer.
  template <class V>
  std::span<V> flat(const bucket& b) noexcept {
    return {reinterpret_cast<V*>(flat_.data()) + b.offset, b.count};
  }

  // Copies bucket b's tensors into its slice of the flat buffer.
  template <class V, class Tensors>
  void gather(const bucket& b, const Tensors& tensors) {
    layout_.gather(tensors, all<V>(), b.first_tensor, b.end_tensor);
  }

  // Copies bucket b's slice of the flat buffer back into its tensors.
  template <class V, class Tensors>
  void scatter(const bucket& b, const Tensors& tensors) {
    layout_.scatter(std::span<const V>(all<V>()), tensors, b.first_tensor, b.end_tensor);
  }

 private:
  template <class V>
  std::span<V> all() noexcept {
    return {reinterpret_cast<V*>(flat_.data()), layout_.total()};
  }

  std::size_t budget_;
  std::size_t element_bytes_ = 0;
  flat_layout layout_;
  std::vector<bucket> buckets_;
  aligned_buffer<std::byte> flat_;
};

// A bucket's reduction on the timeline (GRADWIRE_TIMELINE): its bytes, index and tensors.
template <class Tr, class V>
observe::trace_scope trace_bucket(const communicator<Tr>& comm, const bucket& b, std::size_t index) {
  auto trace = comm.trace("bucket", b.count * sizeof(V), "bucket");
  trace.arg("index", static_cast<std::int64_t>(index))
      .arg("tensors", static_cast<std::int64_t>(b.end_tensor - b.first_tensor));
  return trace;
}

// Reduces every tensor across ranks, with the same result as one all_reduce per tensor
// but one call per bucket. Every rank passes tensors of the same sizes in the same order.
template <class Algorithm = auto_, class Tr, class V>
void bucketed_all_reduce(communicator<Tr>& comm, std::span<const std::span<V>> tensors, bucket_buffer& buffer,
                         reduce_op op = reduce_op::sum) {
  const auto plan = buffer.plan<V>(tensors);
  for (std::size_t k = 0; k < plan.size(); ++k) {
    const bucket& b = plan[k];
    auto trace = trace_bucket<Tr, V>(comm, b, k);
    buffer.gather<V>(b, tensors);
    all_reduce<Algorithm>(comm, buffer.flat<V>(b), op);
    buffer.scatter<V>(b, tensors);
  }
}

}  // namespace gradwire::collective
