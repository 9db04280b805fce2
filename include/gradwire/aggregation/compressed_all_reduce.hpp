// Synchronous all-reduce of compressed gradients: aggregation::all_reduce with a codec (concepts::compressor) on the wire.
//
// As aggregation::all_reduce: gradients go into buckets in the order backward produces them,
// a full bucket is reduced on the communicator's background thread while backward goes on,
// and finish applies each bucket's sum with grad_scale = 1/N. The reduction is
// collective::compressed_all_reduce through the codec (a ring of re-encoded chunks for
// fp16/bf16/int8, an all-gather for top-k, two all-reduces of factors for PowerSGD), with one
// codec state per bucket (error feedback's residual, PowerSGD's Q) allocated at setup. The
// decoded sum is the same bits on every rank, so replicas started equal (setup broadcasts
// rank 0's parameters) stay bit-identical. What differs from all_reduce: the sum is the
// codec's approximation (docs/strategies/compression.md gives each one's error), and the
// bucket plan stays the one made at setup (all_reduce re-plans once in the order rank 0's
// gradients came), because a bucket's codec state belongs to its elements. A codec that plans
// from shapes (PowerSGD) gets each bucket's tensors' shapes from strategy<> (use_shapes): a
// matrix per weight, biases plain. A job of one rank applies its gradients as they are:
// nothing travels, so nothing is compressed.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../collective/compressed_all_reduce.hpp"
#include "../compress/fp16.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "detail/bucketed_reduction.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

template <class Codec, class V, class Tr>
class compressed_all_reduce_agent;

// The policy. Codec: a concepts::compressor (gradwire/compress/: fp16, bf16, int8, top_k,
// error_feedback<C>, powersgd, or a user's). bucket_bytes: the budget of one bucket
// (collective::default_bucket_bytes = 25 MiB), and so of one codec state.
template <class Codec>
class compressed_all_reduce {
 public:
  using codec_type = Codec;
  template <class V, class Tr>
  using agent = compressed_all_reduce_agent<Codec, V, Tr>;

  explicit compressed_all_reduce(Codec codec = Codec(), std::size_t bucket_bytes = collective::default_bucket_bytes)
      : codec_(std::move(codec)), bucket_bytes_(bucket_bytes) {}
  const Codec& codec() const noexcept { return codec_; }
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }

 private:
  Codec codec_;
  std::size_t bucket_bytes_;
};

// One replica's state: the buckets, a codec state and encoded buffers per bucket, the
// reductions in flight.
template <class Codec, class V, class Tr>
class compressed_all_reduce_agent {
  static_assert(concepts::compressor<Codec, V>,
                "gradwire::aggregation::compressed_all_reduce<Codec>: Codec must satisfy concepts::compressor<Codec, V> "
                "for the gradients' value type V (see concepts.hpp and gradwire/compress/)");

 public:
  using codec_type = Codec;
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  explicit compressed_all_reduce_agent(const compressed_all_reduce<Codec>& policy)
      : codec_(policy.codec()), buckets_(policy.bucket_bytes()) {}

  const flat_layout& layout() const noexcept { return buckets_.schedule().layout(); }
  std::span<const collective::bucket> buckets() const noexcept { return buckets_.schedule().buckets(); }
  // Bucket k's codec state (its residual, PowerSGD's Q), for tests and checkpoints.
  const typename Codec::template state<V>& codec_state(std::size_t k) const noexcept { return states_[k].state(); }

  // The tensors' shapes (strategy<> gives them before setup): a codec that plans from them
  // (concepts::shape_aware_compressor: PowerSGD) gets each bucket's, in the bucket's order.
  // Without them (an agent driven by hand) it plans from each bucket's element count.
  void use_shapes(std::span<const shape> shapes) { shapes_.assign(shapes.begin(), shapes.end()); }

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    detail::refuse_min_replicas("aggregation::compressed_all_reduce", "a lost rank ends every step of the job");
    const bool shaped = !shapes_.empty();
    if (shaped) check_shapes(params);
    for (auto p : params) collective::broadcast(comm, p, 0);
    buckets_.setup(params, comm.size() > 1);
    states_.clear();
    if (comm.size() == 1) return;
    std::vector<shape> in_bucket;
    for (const collective::bucket& b : buckets_.schedule().buckets()) {
      if (!shaped) {
        states_.emplace_back(codec_, b.count, comm.size());
        continue;
      }
      in_bucket.clear();
      for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) in_bucket.push_back(shapes_[layout().order()[p]]);
      states_.emplace_back(codec_, std::span<const shape>(in_bucket), comm.size());
    }
  }

  void begin_step(collective::communicator<Tr>&) { buckets_.begin_step(); }

  void ready(collective::communicator<Tr>& comm, std::size_t i, std::span<const V> grad) {
    buckets_.ready(comm, i, grad, [this](collective::communicator<Tr>& c, std::size_t k) { reduce(c, k); });
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>>, Apply&& apply) {
    if (buckets_.applied_alone(comm, apply)) return;
    const auto plan = buckets_.schedule().buckets();
    const V scale = V(1) / static_cast<V>(comm.size());
    if (buckets_.single_bucket()) {
      reduce(comm, 0);
      apply_bucket(plan[0], apply, scale);
      return;
    }
    for (std::size_t k = 0; k < plan.size(); ++k) {  // apply bucket k while k+1 is still reduced
      buckets_.wait(comm, k);
      apply_bucket(plan[k], apply, scale);
    }
    buckets_.waited_all();
  }

 private:
  void check_shapes(std::span<const std::span<V>> params) const {
    bool fits = shapes_.size() == params.size();
    for (std::size_t i = 0; fits && i < params.size(); ++i) fits = shapes_[i].elements() == params[i].size();
    if (!fits)
      throw error(errc::invalid_argument,
                  "gradwire::aggregation::compressed_all_reduce: use_shapes gave " + std::to_string(shapes_.size()) +
                      " shapes that do not match the " + std::to_string(params.size()) +
                      " parameter tensors' sizes; give one shape per tensor, in the tensors' order");
  }

  void reduce(collective::communicator<Tr>& comm, std::size_t k) {
    const collective::bucket& b = buckets_.schedule().buckets()[k];
    auto trace = collective::trace_bucket<Tr, V>(comm, b, k);
    collective::compressed_all_reduce(comm, codec_, states_[k], buckets_.schedule().flat().subspan(b.offset, b.count));
  }

  template <class Apply>
  void apply_bucket(const collective::bucket& b, Apply& apply, V scale) {
    const flat_layout& layout = buckets_.schedule().layout();
    const std::span<const V> flat = buckets_.schedule().flat();
    for (std::size_t p = b.first_tensor; p < b.end_tensor; ++p) {
      const std::size_t i = layout.order()[p];
      apply(i, std::span<const V>(layout.slice(flat, i)), scale);
    }
  }

  Codec codec_;
  std::vector<shape> shapes_;  // [tensor], from use_shapes
  std::vector<collective::compressed_buffer<Codec, V>> states_;  // [bucket], made at setup
  detail::bucketed_reduction<V, Tr> buckets_;  // last: its reductions in flight end before the states go
};

static_assert(concepts::incremental_aggregation<compressed_all_reduce<compress::fp16>, float,
                                                concepts::detail::transport_archetype>);
static_assert(concepts::shape_aware_agent<
              compressed_all_reduce_agent<compress::fp16, float, concepts::detail::transport_archetype>>);
static_assert(concepts::updates_only_through_apply<
              compressed_all_reduce_agent<compress::fp16, float, concepts::detail::transport_archetype>>);

}  // namespace gradwire::aggregation
