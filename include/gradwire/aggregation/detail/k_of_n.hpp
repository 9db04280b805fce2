// K of N for a bucketed all-reduce: the step's close watch, and a late rank's reductions of zeros (docs/elastic.md).
//
// With b backups a step closes when N - b ranks have their first bucket ready
// (close_watch.hpp says how every rank learns the same set). Per step, on the
// communicator's thread: the watch's round runs first, queued when the step begins; a rank
// in the set then reduces its buckets as usual, queued behind the round as each is
// complete; a late rank reduces every bucket at once, in the same order, over a buffer of
// zeros (its own gradients, still to come, are dropped), so the collectives of all ranks
// still match. Every rank applies the sum with scale 1 / |set|: the late rank from its
// zeros buffer, now holding the others' sum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "../../collective/async_engine.hpp"
#include "../../collective/communicator.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../tensor/aligned_buffer.hpp"
#include "close_watch.hpp"

namespace gradwire::aggregation::detail {

template <class V, class Tr>
class k_of_n {
 public:
  using communicator_type = collective::communicator<Tr>;

  explicit k_of_n(int backups) : backups_(backups) {
    if (backups < 0)
      throw error(errc::invalid_argument, "all_reduce: backup_workers = " + std::to_string(backups) + " must be >= 0");
  }

  int backups() const noexcept { return backups_; }
  bool enabled() const noexcept { return backups_ > 0; }

  // Checks the job and allocates the zeros buffer (touched now, not in a step).
  void setup(const communicator_type& comm, std::size_t elements) {
    if (!enabled()) return;
    const std::string asked = "all_reduce: backup_workers = " + std::to_string(backups_);
    if (backups_ >= comm.size())
      throw error(errc::config, asked + " needs more ranks than backups, and the job has " +
                                    std::to_string(comm.size()) + ": at least one rank's gradients must be in each step");
    if constexpr (!concepts::multiplexing_transport<Tr>) {
      throw error(errc::config, asked + ": K of N needs a transport that waits for any of several messages "
                                        "(concepts::multiplexing_transport; asio_tcp, ucx, inproc and mpi have it)");
    } else {
      if (comm.time().runs_background_inline())
        throw error(errc::config, asked + ": K of N does not run in the simulator yet (a simulated rank's "
                                          "communicator work runs inline; docs/elastic.md)");
      watch_ = std::make_unique<close_watch<Tr>>(comm.size(), backups_);
    }
    zeros_.reserve_discard(elements);
    std::fill_n(zeros_.data(), elements, V(0));
    elements_ = elements;
  }

  // The step begins: its round is queued on the communicator's thread, before any bucket.
  // ReduceAll(comm, buffer): reduces every bucket of the step over `buffer` (a flat buffer).
  template <class ReduceAll>
  void begin_step(communicator_type& comm, ReduceAll reduce_all) {
    static_assert(std::is_trivially_copyable_v<ReduceAll>, "k_of_n::begin_step: capture `this` only");
    late_ = false;
    round_ = {};  // a step given up midway: its round ends first
    watch_->open();
    round_ = comm.async().submit([self = this, reduce_all](communicator_type& c) { self->round(c, reduce_all); });
  }

  // The caller's thread, when the step's first bucket is complete: whether this rank is in
  // (reduce its buckets) or late (the step closed without it: reduce nothing, the round has).
  bool first_bucket_ready() {
    late_ = !watch_->mark_ready();
    return !late_;
  }
  bool late() const noexcept { return late_; }

  // Finish: waits for the round (the set, and a late rank's reductions). Returns the scale.
  V wait(const communicator_type& comm) {
    round_.wait(comm.queued_collective_deadline());
    return V(1) / static_cast<V>(set_.size());
  }
  // The late rank's sums: what it applies.
  std::span<V> zeros() noexcept { return {zeros_.data(), elements_}; }
  const step_set& last_set() const noexcept { return set_; }

 private:
  template <class ReduceAll>
  void round(communicator_type& comm, ReduceAll reduce_all) {
    if constexpr (concepts::multiplexing_transport<Tr>) {
      set_ = watch_->run(comm);
      if (set_.self_in) return;
      std::fill_n(zeros_.data(), elements_, V(0));  // last late step left a sum here
      reduce_all(comm, zeros());
    }
  }

  int backups_;
  std::unique_ptr<close_watch<Tr>> watch_;
  aligned_buffer<V> zeros_;
  std::size_t elements_ = 0;
  step_set set_;  // written by the round, read after wait()
  bool late_ = false;
  collective::async_handle round_;  // last: waits for its round before the rest goes
};

}  // namespace gradwire::aggregation::detail
