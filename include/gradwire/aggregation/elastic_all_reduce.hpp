// Synchronous all-reduce that shrinks past a lost replica (docs/elastic.md §2).
//
// Each step's gradients are summed over the current view (transport/view.hpp): the ranks
// still in, renumbered. When a member is lost mid-step (exit, kill -9, a partition or a
// stall the transport detects), the survivors agree on the next view
// (transport/view_change.hpp) and finish the interrupted step in it:
// - if a survivor already applied it, the old view's sums exist: it broadcasts them and
//   the others apply them with the old view's scale;
// - otherwise every survivor sums its own gradients of the step again, scale 1 / |view|.
// Either way every survivor applies the same update, so replicas stay bit-identical.
// Below min_replicas, or without a strict majority of the old view unless every rank lost
// is gone for sure (a closed connection, not a silence), the job fails with peer_lost
// naming the lost ranks. Nothing after the start needs rank 0 or the rendezvous
// store, so any rank may be lost, rank 0 included.
//
// The price: a copy of the step's gradients (an in-place all-reduce overwrites what a
// redo needs) and the previous step's sums (a survivor behind may need them), three
// model-sized buffers; and the reduction starts at finish, not during backward.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/bucketing.hpp"
#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../observe/log.hpp"
#include "../tensor/flat_layout.hpp"
#include "../timeouts.hpp"
#include "../transport/view.hpp"
#include "../transport/view_change.hpp"
#include "min_replicas.hpp"

namespace gradwire::aggregation {

template <class Algorithm, class V, class Tr>
class elastic_all_reduce_agent;

struct elastic_options {
  // The fewest replicas training goes on with; 0: GRADWIRE_MIN_REPLICAS when set (how a
  // launcher-started job chooses it), else 1. A next view must also keep a strict majority
  // of the one before it, so that of two sides of a partition at most one goes on.
  int min_replicas = 0;
  // The most bytes of one all-reduce call over the flat gradients.
  std::size_t bucket_bytes = collective::default_bucket_bytes;
  // How long the agreement on the next view waits for a member that is neither lost nor
  // answering (a stopped process: its kernel still keeps the connection) before it
  // suspects it. 0: GRADWIRE_STALL_TIMEOUT when set, else the communicator's step timeout.
  // Keep it above the longest compute of a step: a member answers at its next wait.
  std::chrono::milliseconds suspect_after{0};
};

// The policy. Algorithm: collective::auto_, ring, halving_doubling or hierarchical; each
// view plans it again for its own members and hosts.
template <class Algorithm = collective::auto_>
class elastic_all_reduce_with {
 public:
  using algorithm = Algorithm;
  template <class V, class Tr>
  using agent = elastic_all_reduce_agent<Algorithm, V, Tr>;

  explicit elastic_all_reduce_with(elastic_options options = {}) : options_(options) {
    if (options_.min_replicas < 0)
      throw error(errc::invalid_argument, "elastic_options::min_replicas = " + std::to_string(options_.min_replicas) +
                                              ": must be positive (0: GRADWIRE_MIN_REPLICAS, else 1)");
    if (options_.min_replicas == 0) options_.min_replicas = min_replicas_from_environment();
    if (options_.suspect_after.count() < 0)
      throw error(errc::invalid_argument, "elastic_options::suspect_after must not be negative");
    if (options_.suspect_after.count() == 0)
      if (const char* text = std::getenv("GRADWIRE_STALL_TIMEOUT"); text && *text)
        options_.suspect_after = parse_seconds("GRADWIRE_STALL_TIMEOUT", text);
    if (options_.bucket_bytes == 0)
      throw error(errc::invalid_argument, "elastic_options::bucket_bytes = 0: a bucket must hold something");
  }
  int min_replicas() const noexcept { return options_.min_replicas; }
  std::size_t bucket_bytes() const noexcept { return options_.bucket_bytes; }
  std::chrono::milliseconds suspect_after() const noexcept { return options_.suspect_after; }

 private:
  elastic_options options_;
};

using elastic_all_reduce = elastic_all_reduce_with<>;

template <class Algorithm, class V, class Tr>
class elastic_all_reduce_agent {
  static_assert(concepts::loss_tolerant_transport<Tr> && concepts::multiplexing_transport<Tr>,
                "gradwire::aggregation::elastic_all_reduce needs a transport that survives a lost peer and waits on "
                "several requests (concepts::loss_tolerant_transport and multiplexing_transport: asio_tcp, ucx); "
                "an MPI job ends with its first lost rank");
  using view_transport = transport::view_transport<Tr>;
  using agreement = transport::view_agreement<Tr>;

 public:
  using algorithm = Algorithm;
  static constexpr bool updates_only_through_apply = true;

  explicit elastic_all_reduce_agent(const elastic_all_reduce_with<Algorithm>& policy)
      : min_replicas_(policy.min_replicas()),
        bucket_elements_(std::max<std::size_t>(1, policy.bucket_bytes() / sizeof(V))),
        suspect_after_(policy.suspect_after()) {}

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    const int n = comm.size();
    if (!concepts::tolerates_loss(comm.transport()))
      throw error(errc::config, "elastic_all_reduce: this transport cannot go on without a lost peer");
    if (min_replicas_ > n)
      throw error(errc::config, "elastic_all_reduce: min_replicas = " + std::to_string(min_replicas_) + " but the job has " +
                                    std::to_string(n) + " ranks");
    for (int p = 0; p < n; ++p)
      if (p != comm.rank()) comm.transport().tolerate_loss(p);
    for (auto p : params) collective::broadcast(comm, p, 0);
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    layout_ = flat_layout(sizes);
    grads_.assign(layout_.total(), V(0));
    for (auto& s : sums_) s.assign(layout_.total(), V(0));
    start_view(comm, transport::view::whole(n));
    last_step_view_ = view();
  }

  void begin_step(collective::communicator<Tr>& comm) { view_comm_->transport().rebind(comm.transport()); }

  void ready(collective::communicator<Tr>&, std::size_t i, std::span<const V> grad) {
    std::copy(grad.begin(), grad.end(), layout_.slice(std::span<V>(grads_), i).begin());
  }

  template <class Apply>
  void finish_step(collective::communicator<Tr>& comm, std::span<const std::span<V>>, Apply&& apply) {
    view_comm_->transport().rebind(comm.transport());
    for (;;) {
      std::vector<V>& sums = sums_[applied_ % 2];
      try {
        std::copy(grads_.begin(), grads_.end(), sums.begin());
        for (std::size_t at = 0; at < sums.size(); at += bucket_elements_)
          collective::all_reduce<Algorithm>(*view_comm_,
                                            std::span<V>(sums).subspan(at, std::min(bucket_elements_, sums.size() - at)));
      } catch (const error& e) {
        if (!recoverable(e)) throw;
        if (recover(comm, e, apply)) return;  // this step came applied from a survivor's sums
        ++redone_;
        continue;
      }
      apply_sums(apply, sums, view());
      return;
    }
  }

  // The current view: its epoch (0 at the start, one more per change) and job ranks.
  const transport::view& view() const noexcept { return view_comm_->transport().members(); }
  // Every job rank left out so far, in the order they were dropped.
  const std::vector<int>& lost_ranks() const noexcept { return lost_; }
  // Steps this rank summed again in a new view after a loss interrupted them.
  std::uint64_t redone_steps() const noexcept { return redone_; }
  // Steps applied since setup (a learning-rate schedule's input).
  std::uint64_t applying_step() const noexcept { return applied_; }
  // The view whose members' gradients the latest applied step summed: the partition of the
  // next step's data (training/elastic_sampler.hpp). The current view, except on a rank
  // that took the interrupted step from another: that step summed the old view's.
  const transport::view& last_step_view() const noexcept { return last_step_view_; }

 private:
  // A member lost, or silent past a timeout (a stopped process, a stall timeout): the
  // agreement finds out which.
  static bool recoverable(const error& e) noexcept { return e.kind() == errc::peer_lost || e.kind() == errc::timeout; }

  // Applies `sums`, the sum over the members of `summed`.
  template <class Apply>
  void apply_sums(Apply& apply, std::span<const V> sums, const transport::view& summed) {
    const auto denominator = static_cast<std::uint32_t>(summed.size());
    const V scale = V(1) / static_cast<V>(denominator);
    for (std::size_t p = 0; p < layout_.tensor_count(); ++p) {
      const std::size_t i = layout_.order()[p];
      apply(i, layout_.slice(sums, i), scale);
    }
    last_denominator_ = denominator;
    last_step_view_ = summed;
    ++applied_;
  }

  void start_view(collective::communicator<Tr>& comm, transport::view v) {
    view_comm_.reset();  // it watches the old agreement's requests
    agreement_ = std::make_unique<agreement>(comm.transport(), v);
    view_transport t(comm.transport(), std::move(v));
    t.watch_proposals(&agreement::proposed_in, agreement_.get());
    t.give_up_after(suspect_after_);
    view_comm_.emplace(std::move(t), comm.options());
  }

  // After a loss: agree on the next view and settle the interrupted step. Returns true
  // when this rank applied the step from a survivor's sums (its finish is over), false
  // when every survivor sums its own gradients of the step again.
  template <class Apply>
  bool recover(collective::communicator<Tr>& comm, const error& cause, Apply& apply) {
    const transport::view began = view();  // where this rank's step was being summed
    for (;;) {
      const transport::view old = view();
      const transport::next_view next =
          agreement_->agree(comm.transport(), {applied_, last_denominator_},
                            {.min_replicas = min_replicas_,
                             .timeout = suspect_after_.count() > 0 ? suspect_after_ : comm.options().timeout});
      lost_.insert(lost_.end(), next.dropped.begin(), next.dropped.end());
      if (observe::log_enabled(observe::log_level::warning))
        observe::log(comm.time(), observe::log_level::warning, comm.rank(), comm.size(), "elastic: view ", next.members.epoch,
                     " keeps ", next.members.size(), " of ", old.size(), " ranks (", cause.what(), ")");
      start_view(comm, next.members);

      std::uint64_t ahead = 0;
      for (const auto& r : next.reports) ahead = std::max(ahead, r.applied);
      bool behind = false;
      for (const auto& r : next.reports) {
        if (r.applied + 1 < ahead)
          throw error(errc::protocol, "elastic: members of view " + std::to_string(next.members.epoch) +
                                          " are more than one step apart (" + std::to_string(r.applied) + " and " +
                                          std::to_string(ahead) + " steps applied)");
        behind = behind || r.applied < ahead;
      }
      if (!behind) return false;
      // Some survivor applied the step the others were finishing: the first of them sends
      // its sums (the previous step's buffer, untouched by the step it has begun since).
      int root = 0;
      while (next.reports[static_cast<std::size_t>(root)].applied != ahead) ++root;
      std::vector<V>& sums = sums_[(ahead - 1) % 2];
      try {
        collective::broadcast(*view_comm_, std::span<V>(sums), root);
      } catch (const error& e) {
        if (!recoverable(e)) throw;
        continue;  // lost again meanwhile: agree on the view after this one
      }
      if (applied_ == ahead) return false;  // this rank sent them, and redoes the step it has begun
      // The sums are over the view in which this rank was summing the step (all of its
      // members contributed, or no survivor could have finished it); the survivor that
      // applied them reports that view's size.
      if (static_cast<std::uint32_t>(began.size()) != next.reports[static_cast<std::size_t>(root)].denominator)
        throw error(errc::protocol, "elastic: rank " + std::to_string(comm.rank()) + " took step " + std::to_string(applied_) +
                                        "'s sums over " +
                                        std::to_string(next.reports[static_cast<std::size_t>(root)].denominator) +
                                        " ranks, but it was summing that step in view " + std::to_string(began.epoch) +
                                        " of " + std::to_string(began.size()));
      apply_sums(apply, sums, began);
      return true;
    }
  }

  int min_replicas_;
  std::size_t bucket_elements_;
  std::chrono::milliseconds suspect_after_;
  flat_layout layout_;
  std::vector<V> grads_;
  std::vector<V> sums_[2];  // step s's sums in sums_[s % 2]: the previous step's stay while this one runs
  std::uint64_t applied_ = 0;
  std::uint32_t last_denominator_ = 0;
  transport::view last_step_view_;
  std::uint64_t redone_ = 0;
  std::vector<int> lost_;
  std::unique_ptr<agreement> agreement_;
  std::optional<collective::communicator<view_transport>> view_comm_;  // after agreement_: destroyed first
};

}  // namespace gradwire::aggregation
