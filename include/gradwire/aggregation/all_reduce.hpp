// Synchronous all-reduce aggregation (MirroredStrategy, MultiWorkerMirroredStrategy, DDP).
//
// Every replica packs its gradients into buckets (collective::bucket_buffer, default 25
// MiB each), the buckets are summed across replicas on the communicator's background
// thread (collective::async_engine), and as each bucket arrives every replica applies the
// same optimizer step to the same sum with grad_scale = 1/N (the average is fused into
// the step), while the next bucket is still being reduced. Replicas started equal (setup
// broadcasts rank 0's parameters) therefore stay bit-identical.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/async.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"

namespace gradwire::aggregation {

namespace detail {
// The aggregation is not a template over the transport, its engine is: held behind this.
struct engine_holder_base {
  virtual ~engine_holder_base() = default;
  const void* comm = nullptr;  // the communicator the engine runs on
};
template <class Tr>
struct engine_holder final : engine_holder_base {
  explicit engine_holder(collective::communicator<Tr>& c) : engine(c) { comm = &c; }
  collective::async_engine<Tr> engine;
};
}  // namespace detail

// Algorithm: collective::auto_, ring, halving_doubling or hierarchical (see collective/all_reduce.hpp).
template <class Algorithm = collective::auto_>
class all_reduce_with {
 public:
  using algorithm = Algorithm;
  // Parameters change only through apply(): a device replica keeps them on the device.
  static constexpr bool updates_only_through_apply = true;

  // bucket_bytes: the budget of one bucket (collective::default_bucket_bytes = 25 MiB).
  explicit all_reduce_with(std::size_t bucket_bytes = collective::default_bucket_bytes) : buckets_(bucket_bytes) {}

  template <class Tr, class V>
  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) collective::broadcast(comm, p, 0);
  }

  template <class Tr, class V, class Apply>
  void step(collective::communicator<Tr>& comm, std::span<const std::span<V>>,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    if (comm.size() == 1) {
      for (std::size_t i = 0; i < grads.size(); ++i) apply(i, grads[i], V(1));
      return;
    }
    const auto plan = buckets_.plan<V>(grads);
    if (plan.size() == 1) {
      // One bucket: nothing to overlap, so reduce on this thread and spare the two
      // hand-offs to the engine's thread (they cost most when cores are oversubscribed).
      {
        auto trace = collective::trace_bucket<Tr, V>(comm, plan[0], 0);
        buckets_.gather<V>(plan[0], grads);
        collective::all_reduce<Algorithm>(comm, buckets_.flat<V>(plan[0]));
      }
      apply_bucket(plan[0], grads, apply, V(1) / static_cast<V>(comm.size()));
      return;
    }
    auto& engine = engine_for(comm);
    pending_.clear();
    try {
      reduce_and_apply<Algorithm>(comm, engine, plan, grads, apply);
    } catch (...) {
      pending_.clear();  // each handle waits for its reduction: no bucket is in use after we return
      throw;
    }
  }

 private:
  template <class Alg, class Tr, class V, class Apply>
  void reduce_and_apply(collective::communicator<Tr>& comm, collective::async_engine<Tr>& engine,
                        std::span<const collective::bucket> plan, std::span<const std::span<const V>> grads,
                        Apply& apply) {
    // Start every bucket as soon as it is packed: bucket k is reduced while k+1 is packed.
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const collective::bucket& b = plan[k];
      buckets_.gather<V>(b, grads);
      pending_.push_back(engine.submit([data = buckets_.flat<V>(b), bucket = &b, k](collective::communicator<Tr>& c) {
        auto trace = collective::trace_bucket<Tr, V>(c, *bucket, k);
        collective::all_reduce<Alg>(c, data);
      }));
    }
    // Apply bucket k while bucket k+1 is still being reduced.
    const V scale = V(1) / static_cast<V>(comm.size());
    for (std::size_t k = 0; k < plan.size(); ++k) {
      pending_[k].wait(comm.step_deadline());
      apply_bucket(plan[k], grads, apply, scale);
    }
    pending_.clear();
  }

  // The optimizer step on every tensor of a reduced bucket.
  template <class V, class Apply>
  void apply_bucket(const collective::bucket& b, std::span<const std::span<const V>> grads, Apply& apply, V scale) {
    const std::span<const V> flat = buckets_.flat<V>(b);
    std::size_t offset = 0;
    for (std::size_t i = b.first_tensor; i < b.end_tensor; ++i) {
      apply(i, flat.subspan(offset, grads[i].size()), scale);
      offset += grads[i].size();
    }
  }

  template <class Tr>
  collective::async_engine<Tr>& engine_for(collective::communicator<Tr>& comm) {
    auto* holder = dynamic_cast<detail::engine_holder<Tr>*>(engine_.get());
    if (!holder || holder->comm != &comm) {  // first step, or the communicator moved
      engine_.reset();
      auto fresh = std::make_unique<detail::engine_holder<Tr>>(comm);
      holder = fresh.get();
      engine_ = std::move(fresh);
    }
    return holder->engine;
  }

  collective::bucket_buffer buckets_;  // plan and flat buffer, reused across steps
  std::vector<collective::async_handle> pending_;
  // Declared last, so destroyed first: its thread stops before the buffers go.
  std::unique_ptr<detail::engine_holder_base> engine_;
};

using all_reduce = all_reduce_with<>;

}  // namespace gradwire::aggregation
