// A bucketed aggregation's step, written once for all_reduce and central: the buckets, their reductions in flight, a job of one rank.
//
// Each gradient goes into its bucket (bucket_schedule); a bucket that is complete is
// reduced on the communicator's background thread while backward goes on. With a single
// bucket there is nothing to overlap: finish reduces it on the caller's thread, sparing
// the two hand-offs (they cost most when cores are oversubscribed). In a job of one rank
// the gradients are the update, applied as they are. What "reduce bucket k" means (an
// all-reduce, a reduce onto the owner) is the aggregation's.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "../../collective/async_engine.hpp"
#include "../../collective/communicator.hpp"
#include "bucket_schedule.hpp"

namespace gradwire::aggregation::detail {

template <class V, class Tr>
class bucketed_reduction {
 public:
  using communicator_type = collective::communicator<Tr>;

  explicit bucketed_reduction(std::size_t bucket_bytes) : schedule_(bucket_bytes) {}

  bucket_schedule<V>& schedule() noexcept { return schedule_; }
  const bucket_schedule<V>& schedule() const noexcept { return schedule_; }

  // Setup: one slot per tensor for a job of one rank, and the buckets planned over the
  // tensors' sizes when `plan_buckets` (a job of one rank needs none, unless the
  // aggregation uses the flat buffer for something else).
  void setup(std::span<const std::span<V>> params, bool plan_buckets) {
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    alone_.assign(params.size(), {});
    if (plan_buckets) schedule_.plan(sizes);
    pending_.reserve(schedule_.buckets().size());
  }

  void begin_step() {
    pending_.clear();  // a step given up midway: each handle waits for its reduction
    schedule_.begin_step();
  }

  // Gradient i is final: kept as it is in a job of one rank; otherwise copied into its
  // bucket, and each bucket that goes out is reduced by `reduce(comm, k)` on the
  // background thread (Reduce: trivially copyable, e.g. a lambda capturing `this`), unless
  // `goes(k)`, asked as bucket k goes out, says this rank reduces none of its own (K of N's
  // late rank, k_of_n.hpp).
  template <class Reduce, class Goes = bool (*)(std::size_t)>
  void ready(communicator_type& comm, std::size_t i, std::span<const V> grad, Reduce reduce,
             Goes goes = [](std::size_t) { return true; }) {
    static_assert(std::is_trivially_copyable_v<Reduce>, "bucketed_reduction::ready: capture `this` only");
    if (comm.size() == 1) {
      alone_[i] = grad;
      return;
    }
    schedule_.ready(i, grad, [&](std::size_t k) {
      if (!goes(k)) return;
      if (single_bucket()) return;  // reduced at finish, on the caller's thread
      pending_.push_back(comm.async().submit([reduce, k](communicator_type& c) { reduce(c, k); }));
    });
  }

  // A job of one rank: applies this step's gradients as they are (grad_scale 1). Returns
  // whether the job was one.
  template <class Apply>
  bool applied_alone(const communicator_type& comm, Apply& apply) {
    if (comm.size() != 1) return false;
    for (std::size_t i = 0; i < alone_.size(); ++i) apply(i, alone_[i], V(1));
    return true;
  }

  // One bucket: ready() queued nothing, finish reduces it on its own thread.
  bool single_bucket() const noexcept { return schedule_.buckets().size() == 1; }
  // Waits for bucket k's reduction, queued by ready() (not with a single bucket).
  void wait(const communicator_type& comm, std::size_t k) { pending_[k].wait(comm.queued_collective_deadline()); }
  // Every reduction of this step waited for: the handles go.
  void waited_all() noexcept { pending_.clear(); }

 private:
  bucket_schedule<V> schedule_;
  std::vector<std::span<const V>> alone_;  // one rank: this step's gradients
  // Last, so destroyed first: each waits for its reduction before the buffers go.
  std::vector<collective::async_handle> pending_;
};

}  // namespace gradwire::aggregation::detail
