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
// Over a transport that takes a lost rank's replacement back (asio_tcp), the job also
// grows again (docs/elastic.md §3, detail/elastic_join.hpp): a process started with
// GRADWIRE_REJOIN=1 asks to join, the members let it in at a step boundary agreed through
// control slots in the step's own all-reduce, and it takes the parameters, the optimizer
// state and the step count from them, no checkpoint read.
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
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "../collective/all_reduce.hpp"
#include "../collective/barrier.hpp"
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
#include "detail/elastic_join.hpp"
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
  // Take a lost rank's replacement (a process started with GRADWIRE_REJOIN=1) back in at a
  // step boundary, with its state from the members. Only where the transport can take one
  // back (concepts::rejoinable_transport: asio_tcp); elsewhere a replacement is refused.
  bool joins = true;
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
  bool joins() const noexcept { return options_.joins; }

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
  static constexpr bool can_take_back = concepts::rejoinable_transport<Tr>;

 public:
  using algorithm = Algorithm;
  static constexpr bool updates_only_through_apply = true;

  explicit elastic_all_reduce_agent(const elastic_all_reduce_with<Algorithm>& policy)
      : min_replicas_(policy.min_replicas()),
        bucket_elements_(std::max<std::size_t>(1, policy.bucket_bytes() / sizeof(V))),
        suspect_after_(policy.suspect_after()),
        joins_(policy.joins() && can_take_back) {}

  void setup(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    const int n = comm.size();
    const bool replacement = concepts::rejoined(comm.transport());
    if (replacement && !joins_)
      throw error(errc::config, "elastic_all_reduce: rank " + std::to_string(comm.rank()) +
                                    " replaces a lost rank (GRADWIRE_REJOIN=1), but " +
                                    (can_take_back ? "elastic_options::joins is off"
                                                   : "this transport cannot take a replacement back (asio_tcp and ucx can)"));
    if (!concepts::tolerates_loss(comm.transport()))
      throw error(errc::config, "elastic_all_reduce: this transport cannot go on without a lost peer");
    if (min_replicas_ > n)
      throw error(errc::config, "elastic_all_reduce: min_replicas = " + std::to_string(min_replicas_) + " but the job has " +
                                    std::to_string(n) + " ranks");
    for (int p = 0; p < n; ++p)
      if (p != comm.rank()) comm.transport().tolerate_loss(p);
    std::vector<std::size_t> sizes;
    for (auto p : params) sizes.push_back(p.size());
    layout_ = flat_layout(sizes);
    model_ = detail::model_fingerprint(sizeof(V), sizes);
    params_.assign(params.begin(), params.end());
    // After the gradients, with joins, one control slot per job rank (detail/elastic_join.hpp).
    control_ = layout_.total();
    const std::size_t slots = joins_ ? static_cast<std::size_t>(n) : 0;
    grads_.assign(control_ + slots, V(0));
    for (auto& s : sums_) s.assign(control_ + slots, V(0));
    if constexpr (can_take_back)
      if (joins_) listener_.emplace(n);
    if (replacement) {
      enter_as_replacement(comm);
      return;
    }
    for (auto p : params) collective::broadcast(comm, p, 0);
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
        mark_join_requests(comm, sums);
        for (std::size_t at = 0; at < sums.size(); at += bucket_elements_)
          collective::all_reduce<Algorithm>(*view_comm_,
                                            std::span<V>(sums).subspan(at, std::min(bucket_elements_, sums.size() - at)));
      } catch (const error& e) {
        if (!recoverable(e)) throw;
        if (recover(comm, e.what(), apply)) return;  // this step came applied from a survivor's sums
        ++redone_;
        continue;
      }
      apply_sums(apply, sums, view());
      if (const std::vector<int> admits = admitted(sums); !admits.empty()) admit(comm, apply, admits);
      return;
    }
  }

  // Joins: strategy<> calls this after setup and after every step. After a step that let a
  // replacement in (and after a replacement's setup) the members hand it the model's state.
  bool averages_optimizer_state() const noexcept { return joins_; }
  template <class W, class State>
  void synchronise_state(collective::communicator<Tr>& comm, std::span<State> states) {
    if constexpr (!concepts::buffer_visiting_state<State>) {
      if (joins_)
        throw error(errc::config, "elastic_all_reduce: joins hand a replacement the optimizer state, and this "
                                  "optimizer's state does not show its buffers (for_each_buffer; see "
                                  "gradwire/optim/adam.hpp): set elastic_options::joins = false");
    } else {
      if (!transfer_) return;
      const detail::state_roles transfer = std::move(*transfer_);
      transfer_.reset();
      view_comm_->transport().rebind(comm.transport());
      hand_over_state(comm, states, transfer);
    }
  }

  // The current view: its epoch (0 at the start, one more per change) and job ranks.
  const transport::view& view() const noexcept { return view_comm_->transport().members(); }
  // Every job rank left out so far, in the order they were dropped.
  const std::vector<int>& lost_ranks() const noexcept { return lost_; }
  // Steps this rank summed again in a new view after a loss interrupted them.
  std::uint64_t redone_steps() const noexcept { return redone_; }
  // Joins: what a replacement needs besides the model, the training loop's own position
  // (its data sampler: training::elastic_sampler::save). `save` runs on the member that
  // welcomes a replacement, inside the finish of the step that lets it in, once that step
  // is applied (it must describe the loop after the step); the replacement reads the bytes
  // with loop_state() once its strategy is constructed.
  void on_join(std::function<std::vector<std::byte>()> save) { save_loop_state_ = std::move(save); }
  // On a replacement: the bytes the welcoming member's on_join gave (empty elsewhere).
  std::span<const std::byte> loop_state() const noexcept { return loop_state_; }
  // The latest state handed to replacements (a member) or taken (a replacement): its bytes,
  // and the seconds from the first chunk posted to the last one done.
  struct state_transfer_stats {
    std::uint64_t bytes = 0;
    double seconds = 0;
  };
  const state_transfer_stats& last_state_transfer() const noexcept { return transfer_stats_; }
  // Every job rank taken back in so far (replacements), in the order they joined.
  const std::vector<int>& joined_ranks() const noexcept { return joined_; }
  // Steps applied since the job began (a learning-rate schedule's input); a replacement
  // starts from the members' count, and its training loop from there.
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

  // After a loss (or a step whose sums admit replacements: `admits`, this rank's step
  // applied): agree on the next view and settle the interrupted step. Returns true when
  // this rank applied the step from a survivor's sums (its finish is over), false when
  // every survivor sums its own gradients of the step again (or there was none to settle).
  template <class Apply>
  bool recover(collective::communicator<Tr>& comm, const std::string& cause, Apply& apply, std::span<const int> admits = {}) {
    const transport::view began = view();  // where this rank's step was being summed
    for (;;) {
      const transport::view old = view();
      const transport::next_view next =
          agreement_->agree(comm.transport(), {applied_, last_denominator_},
                            {.min_replicas = min_replicas_,
                             .timeout = suspect_after_.count() > 0 ? suspect_after_ : comm.options().timeout},
                            admits);
      admits = {};  // asked once: a later agreement (a loss meanwhile) only shrinks
      lost_.insert(lost_.end(), next.dropped.begin(), next.dropped.end());
      if (observe::log_enabled(observe::log_level::warning)) {
        std::string joined;
        for (int r : next.joined) joined += (joined.empty() ? " and takes rank " : ", rank ") + std::to_string(r) + " back";
        observe::log(comm.time(), observe::log_level::warning, comm.rank(), comm.size(), "elastic: view ", next.members.epoch,
                     " keeps ", next.members.size() - static_cast<int>(next.joined.size()), " of ", old.size(), " ranks",
                     joined, " (", cause, ")");
      }
      start_view(comm, next.members);
      if constexpr (can_take_back)
        if (joins_)
          for (int r : next.dropped) listener_->listen(comm.transport(), r);
      if (!next.joined.empty()) {  // a clean step boundary: nobody dropped, nobody behind
        welcome_joiners(comm, next);
        return false;
      }

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

  // Joins (detail/elastic_join.hpp). Into the step's control slots: 1 for each job rank
  // outside the view whose replacement asked this member to join.
  void mark_join_requests(collective::communicator<Tr>& comm, std::span<V> sums) {
    if constexpr (can_take_back) {
      if (!joins_) return;
      for (int r = 0; r < comm.size(); ++r)
        if (view().position_of(r) < 0 && r != comm.rank())
          sums[control_ + static_cast<std::size_t>(r)] = listener_->asked(comm.transport(), r) ? V(1) : V(0);
    }
  }
  // The ranks every member heard from: their slot sums to the view's size (the same sums,
  // so the same answer, on every member).
  std::vector<int> admitted(std::span<const V> sums) const {
    std::vector<int> admits;
    if (!joins_) return admits;
    for (std::size_t r = 0; r + control_ < sums.size(); ++r)
      if (sums[control_ + r] == static_cast<V>(view().size())) admits.push_back(static_cast<int>(r));
    return admits;
  }

  // After a step whose sums admit replacements (this rank applied it): the agreement that
  // takes them in. A barrier first, so that no member is still inside the step's all-reduce
  // when the agreement's proposals arrive (they end every wait in the view: that member
  // would give up a step it was about to complete, and the join would wait for another).
  // A member woken in the barrier has applied the step too, so every report is level.
  template <class Apply>
  void admit(collective::communicator<Tr>& comm, Apply& apply, const std::vector<int>& admits) {
    try {
      collective::barrier(*view_comm_);
    } catch (const error& e) {
      if (!recoverable(e)) throw;
    }
    recover(comm, "every member holds a replacement's request to join", apply, admits);  // this step stays applied
  }

  // A member, after the agreement that took replacements in: every old member welcomes them
  // (the same view and step: a replacement takes the first); every member then owes them
  // the state (synchronise_state, right after this step).
  void welcome_joiners(collective::communicator<Tr>& comm, const transport::next_view& next) {
    detail::state_roles transfer = detail::state_roles::of(next.members, next.joined);
    for (int r : next.joined) {
      if constexpr (can_take_back) listener_->admitted(r);
      joined_.push_back(r);
    }
    // The loop's bytes come from the first old member alone: a large message nobody receives
    // would hold up the connection it was sent on (asio_tcp leaves it unread until a
    // receive asks for it), and the state's chunks behind it with it.
    const std::vector<std::byte> loop =
        comm.rank() == transfer.first_old && save_loop_state_ ? save_loop_state_() : std::vector<std::byte>{};
    const detail::welcome w{view(), next.joined, applied_, last_denominator_, loop.size(), model_};
    const std::vector<std::byte> bytes = w.encode(comm.size());
    const deadline until = comm.time().deadline_after(comm.options().timeout);
    std::vector<typename Tr::request> sends;
    for (int r : next.joined) {
      sends.push_back(comm.transport().async_send(r, detail::welcome_tag, std::span(bytes)));
      if (!loop.empty()) sends.push_back(comm.transport().async_send(r, detail::loop_state_tag, std::span(loop)));
    }
    for (auto& s : sends) try {
        comm.transport().wait(s, until);
      } catch (const error& e) {  // a replacement lost again: the state's transfer finds out
        if (!recoverable(e)) throw;
      }
    last_step_view_ = view();  // the next step's data is shared over the new view
    transfer_ = std::move(transfer);
  }

  // A replacement's setup: asks every member it reaches, takes the first welcome (the view
  // it enters, the step count) and the loop's bytes, and owes itself the state
  // (synchronise_state, next).
  void enter_as_replacement(collective::communicator<Tr>& comm) {
    auto& base = comm.transport();
    const int me = comm.rank(), n = comm.size();
    detail::entry e = detail::enter(base, model_, comm.time().deadline_after(comm.options().timeout));
    loop_state_ = std::move(e.loop_state);
    applied_ = e.message.applied;
    last_denominator_ = e.message.denominator;
    start_view(comm, e.message.members);
    last_step_view_ = view();
    joined_ = e.message.joined;
    transfer_ = std::move(e.roles);
    if constexpr (can_take_back)  // the ranks still out may send replacements of their own
      for (int r = 0; r < n; ++r)
        if (view().position_of(r) < 0) listener_->listen(base, r);
    if (observe::log_enabled(observe::log_level::warning))
      observe::log(comm.time(), observe::log_level::warning, me, n, "elastic: rank ", me, " joined view ", view().epoch,
                   " of ", view().size(), " ranks at step ", applied_, " (welcomed by rank ", e.sender, ")");
  }

  // The state, from the old members to the replacements: parameters, optimizer buffers and
  // counters, in place on the replacements. A loss meanwhile: a replacement fails (it lacks
  // part of its state; the launcher may start it again), the members agree on the next view.
  template <class State>
  void hand_over_state(collective::communicator<Tr>& comm, std::span<State> states, const detail::state_roles& transfer) {
    const bool joining = std::find(transfer.joiners.begin(), transfer.joiners.end(), view_comm_->rank()) !=
                         transfer.joiners.end();
    std::vector<std::span<std::byte>> segments;
    for (auto p : params_) segments.push_back(std::as_writable_bytes(p));
    for (auto& st : states) st.for_each_buffer([&](std::span<V> b) { segments.push_back(std::as_writable_bytes(b)); });
    counters_.clear();
    if constexpr (concepts::counter_visiting_state<State>)
      for (auto& st : states) st.for_each_counter([&](long& c) { counters_.push_back(static_cast<std::int64_t>(c)); });
    segments.push_back(std::as_writable_bytes(std::span(counters_)));
    const auto began = comm.time().now();
    try {
      detail::transfer_state(*view_comm_, std::span<const std::span<std::byte>>(segments), transfer.senders,
                             transfer.joiners, comm.time().deadline_after(comm.options().timeout));
      transfer_stats_.bytes = 0;
      for (auto segment : segments) transfer_stats_.bytes += segment.size();
      transfer_stats_.seconds = std::chrono::duration<double>(comm.time().now() - began).count();
    } catch (const error& e) {
      if (joining || !recoverable(e))
        throw error(e.kind(), std::string(joining ? "elastic_all_reduce: a replacement could not take its state: " : "") +
                                  e.details());
      auto none = [](std::size_t, std::span<const V>, V) {
        throw error(errc::protocol, "elastic: a step to settle after a state transfer (members were at one step)");
      };
      recover(comm, e.what(), none);
      return;
    }
    if constexpr (concepts::counter_visiting_state<State>)
      if (joining) {
        std::size_t i = 0;
        for (auto& st : states) st.for_each_counter([&](long& c) { c = static_cast<long>(counters_[i++]); });
      }
  }

  int min_replicas_;
  std::size_t bucket_elements_;
  std::chrono::milliseconds suspect_after_;
  bool joins_;
  flat_layout layout_;
  std::vector<std::span<V>> params_;  // the replica's, as setup gave them (a replacement's state goes there)
  std::size_t control_ = 0;           // where grads_ and sums_ hold the join slots
  std::uint64_t model_ = 0;           // detail::model_fingerprint of the parameters
  std::conditional_t<can_take_back, std::optional<detail::join_listener<Tr>>, std::monostate> listener_;
  std::optional<detail::state_roles> transfer_;  // owed after this step (or this replacement's setup)
  std::vector<std::int64_t> counters_;      // the optimizer's counters, in transit
  state_transfer_stats transfer_stats_;
  std::vector<int> joined_;
  std::function<std::vector<std::byte>()> save_loop_state_;  // on_join
  std::vector<std::byte> loop_state_;                         // a replacement's, from its welcome
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
