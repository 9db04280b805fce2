// A view of a job: the ranks still in it, renumbered 0..n-1, as a transport of its own.
//
// An elastic job (docs/elastic.md §2) runs each view's collectives on a communicator over
// view_transport<Tr>: position p is the view's p-th member, and every tag carries a salt
// of the view (its epoch and members), so that no message of an earlier view, or of a
// view another rank holds by mistake, is ever matched in this one. A wait also ends, with
// peer_lost, as soon as a member is lost or a member proposes the next view: a survivor
// whose live neighbour abandoned a collective learns it at once, not at the step timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../support/fnv1a.hpp"
#include "../support/topology.hpp"

namespace gradwire::transport {

// Salts of views take the bytes below this in bits 40..47 of a tag (see below).
inline constexpr std::uint8_t view_salt_end = 0xF0;

// Who is in: the epoch (0 for the job as it started) and the job ranks, ascending.
struct view {
  std::uint32_t epoch = 0;
  std::vector<int> members;

  static view whole(int size) {
    view v;
    for (int r = 0; r < size; ++r) v.members.push_back(r);
    return v;
  }
  int size() const noexcept { return static_cast<int>(members.size()); }
  // The position of job rank `rank` in the view, or -1.
  int position_of(int rank) const noexcept {
    const auto it = std::lower_bound(members.begin(), members.end(), rank);
    return it != members.end() && *it == rank ? static_cast<int>(it - members.begin()) : -1;
  }
  // One byte of the view's epoch and members (tags carry it, view_transport::salted),
  // below view_salt_end (the bytes above belong to the agreement's and the joins' tags):
  // the epoch modulo 15 in the high four bits, so that views fewer than 15 epochs apart
  // never share a salt (a frame left over from an abandoned view, unread, can never meet a
  // later view's collective of the same sequence number: a hash of both alone did, 1 time
  // in 240, seen in a chaos run); four bits of the members' hash below, so that two ranks
  // holding different views of one epoch (a timeout on one side) rarely match either.
  std::uint8_t salt() const noexcept {
    const std::uint64_t h = support::fnv1a().add(std::as_bytes(std::span(members))).value();
    const auto members_bits = static_cast<std::uint8_t>((h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) & 0xF);
    return static_cast<std::uint8_t>((epoch % 15) * 16 + members_bits);
  }
  friend bool operator==(const view&, const view&) = default;
};

// Tags of a view's collectives stay below 2^40 (sequence numbers below 2^24 per view);
// bits 40..47 hold the view's salt, below view_salt_end. Tags of the agreement on the next
// view (transport/view_change.hpp) and of joins (a replacement's request and its welcome,
// aggregation/detail/elastic_join.hpp) live in their own ranges above it, which no
// collective's salted tag can reach.
inline constexpr std::uint64_t view_tag_bits = 40;
inline constexpr std::uint64_t view_change_tag_base = std::uint64_t{0xF6} << 40;
inline constexpr std::uint64_t join_tag_base = std::uint64_t{0xF7} << 40;
static_assert((view_change_tag_base >> view_tag_bits) >= view_salt_end && (join_tag_base >> view_tag_bits) >= view_salt_end);

template <class Tr>
  requires concepts::multiplexing_transport<Tr> && concepts::loss_tolerant_transport<Tr>
class view_transport {
 public:
  using request = typename Tr::request;
  // How often a wait looks for lost members and proposals of the next view.
  static constexpr std::chrono::milliseconds poll{20};

  // `base` must outlive this (rebind() follows it when its owner moves).
  view_transport(Tr& base, view v) : base_(&base), view_(std::move(v)), salt_(view_.salt()) {
    position_ = view_.position_of(base.rank());
    if (position_ < 0)
      throw error(errc::invalid_argument, "view_transport: rank " + std::to_string(base.rank()) +
                                              " is not a member of view " + std::to_string(view_.epoch));
    const cluster::topology job = topology_of(base);
    std::vector<int> hosts;
    for (int r : view_.members) hosts.push_back(job.host(r));
    topology_ = cluster::topology(std::move(hosts));
  }

  void rebind(Tr& base) noexcept { base_ = &base; }
  // A wait that lasts this long ends with timeout, naming the view (0: only at its
  // deadline): the polling here stands in for the transport's own stall timeout.
  void give_up_after(std::chrono::milliseconds after) noexcept { give_up_after_ = after; }
  // A wait also ends when proposed(context) says a member proposes the next view
  // (view_change.hpp's view_agreement::proposed).
  void watch_proposals(bool (*proposed)(void* context, Tr& base), void* context) noexcept {
    proposed_ = proposed;
    proposal_context_ = context;
  }

  const transport::view& members() const noexcept { return view_; }
  int rank() const noexcept { return position_; }
  int size() const noexcept { return view_.size(); }
  const cluster::topology& topology() const noexcept { return topology_; }
  time_source time() const { return concepts::time_of(*base_); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    return base_->async_send(job_rank(peer), salted(tag), bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    return base_->async_recv(job_rank(peer), salted(tag), bytes);
  }
  template <class V>
    requires concepts::accumulating_transport<Tr, V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return base_->async_recv_accumulate(job_rank(peer), salted(tag), inout);
  }

  void wait(request& r, deadline until) {
    request* one[] = {&r};
    await(one, until);
    base_->wait(r, until);
  }
  std::size_t wait_any(std::span<request* const> requests, deadline until) { return await(requests, until); }

  auto traffic() const
    requires concepts::metered_transport<Tr>
  {
    return base_->traffic();
  }
  // A disagreement a collective finds (a mismatched call) fails the whole job, as without views.
  void fail(errc cause, const std::string& reason)
    requires concepts::failable_transport<Tr>
  {
    base_->fail(cause, reason);
  }

 private:
  static cluster::topology topology_of(const Tr& t) {
    if constexpr (concepts::topology_aware_transport<Tr>)
      return t.topology();
    else
      return cluster::topology::one_host(t.size());
  }

  int job_rank(int position) const {
    if (position < 0 || position >= size())
      throw error(errc::invalid_argument, "view_transport: position " + std::to_string(position) + " is not in view " +
                                              std::to_string(view_.epoch) + " of " + std::to_string(size()) + " ranks");
    return view_.members[static_cast<std::size_t>(position)];
  }
  std::uint64_t salted(std::uint64_t tag) const {
    if (tag >> view_tag_bits)
      throw error(errc::invalid_argument, "view_transport: tag " + std::to_string(tag) +
                                              " does not fit below 2^40 (more than 2^24 collectives in one view)");
    return tag | (std::uint64_t{salt_} << view_tag_bits);
  }

  // Waits for one of `requests` in slices of `poll`; between slices, a lost member or a
  // member's proposal of the next view ends the wait with peer_lost.
  std::size_t await(std::span<request* const> requests, deadline until) {
    const time_source time = concepts::time_of(*base_);
    const deadline began = time.now();
    if (give_up_after_.count() > 0) until = std::min(until, time.deadline_after(give_up_after_));
    for (;;) {
      check_members();
      const deadline slice = std::min(until, time.deadline_after(poll));
      try {
        return base_->wait_any(requests, slice);
      } catch (const error& e) {
        if (e.kind() != errc::timeout) throw;
        if (slice == until)
          throw error(errc::timeout, "view " + std::to_string(view_.epoch) + ": rank " + std::to_string(base_->rank()) +
                                         " waited " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                         time.now() - began).count()) +
                                         " ms for a member (elastic: the survivors agree on the next view)");
      }
    }
  }

  void check_members() {
    for (int lost : base_->lost_peers())
      if (view_.position_of(lost) >= 0)
        throw error(errc::peer_lost, "rank " + std::to_string(lost) + " of view " + std::to_string(view_.epoch) +
                                         " was lost (elastic: the survivors agree on the next view)");
    if (proposed_ != nullptr && proposed_(proposal_context_, *base_))
      throw error(errc::peer_lost, "a member of view " + std::to_string(view_.epoch) +
                                       " proposes the next view (elastic: it lost a rank this one has not)");
  }

  Tr* base_;
  transport::view view_;
  std::uint8_t salt_;
  int position_ = -1;
  cluster::topology topology_;
  std::chrono::milliseconds give_up_after_{0};
  bool (*proposed_)(void*, Tr&) = nullptr;
  void* proposal_context_ = nullptr;
};

}  // namespace gradwire::transport
