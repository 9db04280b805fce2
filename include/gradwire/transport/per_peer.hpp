// A transport made of two: shared memory (Intra) to the ranks on this rank's host, the network (Inter) to the others.
//
// Why: hierarchy pays only when a host's ranks talk through memory and only the traffic
// between hosts crosses the network. UCX cannot be left to choose per peer on emulated
// hosts (network namespaces of one machine): it sees one machine and takes shared memory
// to every rank, past the emulated link (docs/transports.md, "Per peer"). per_peer
// decides by the job's topology instead: Intra joins among the host's ranks only
// (numbered by local rank), Inter among all ranks; a message to peer p goes through
// Intra, addressed to p's local rank, when p shares this host, and through Inter
// otherwise. cluster::join_per_peer() builds the usual pair, per_peer<ucx, asio_tcp>.
//
// Template parameters, each a concepts::multiplexing_transport (a wait on one must keep
// the other moving, see wait()):
//   Intra  ranks of one host; its rank() and size() are the local rank and local size
//   Inter  every rank of the job; its rank() and size() are the job's
// Optional capabilities are forwarded where both have them (the concepts decide, as for
// any_transport): fail, traffic (the sum), tolerate_loss / lost_peers,
// async_recv_accumulate. topology() is always there (concepts::topology_aware_transport).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "../support/topology.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../timeouts.hpp"
#include "detail/messages.hpp"
#include "traffic.hpp"

namespace gradwire::transport {

template <concepts::multiplexing_transport Intra, concepts::multiplexing_transport Inter>
class per_peer {
 public:
  using intra_type = Intra;
  using inter_type = Inter;

  // An operation of either transport; empty (false) once waited for or default-made.
  class request {
   public:
    request() = default;
    explicit operator bool() const noexcept {
      return std::visit(
          [](const auto& r) {
            if constexpr (std::same_as<std::remove_cvref_t<decltype(r)>, std::monostate>)
              return false;
            else if constexpr (requires { static_cast<bool>(r); })
              return static_cast<bool>(r);
            else
              return true;
          },
          held_);
    }

   private:
    friend class per_peer;
    // By index, not type: Intra and Inter may be one type (and so their requests).
    template <std::size_t I, class R>
    request(std::in_place_index_t<I> part, R&& r) : held_(part, std::forward<R>(r)) {}
    std::variant<std::monostate, typename Intra::request, typename Inter::request> held_;
  };

  // `topology` must be the job's (Inter's ranks) and Intra must span exactly this rank's
  // host, numbered by local rank.
  per_peer(Intra intra, Inter inter, cluster::topology topology)
      : intra_(std::move(intra)), inter_(std::move(inter)), topology_(std::move(topology)) {
    const int me = inter_.rank();
    if (topology_.size() != inter_.size())
      throw error(errc::config, "per_peer: the topology has " + std::to_string(topology_.size()) +
                                    " ranks, the network transport " + std::to_string(inter_.size()));
    if (intra_.size() != topology_.local_size(me) || intra_.rank() != topology_.local_rank(me))
      throw error(errc::config, "per_peer: rank " + std::to_string(me) + " is local rank " +
                                    std::to_string(topology_.local_rank(me)) + " of " +
                                    std::to_string(topology_.local_size(me)) + " on its host, but its shared-memory "
                                    "transport is rank " + std::to_string(intra_.rank()) + " of " +
                                    std::to_string(intra_.size()) + ": join it among the host's ranks only");
  }

  int rank() const { return inter_.rank(); }
  int size() const { return inter_.size(); }
  const cluster::topology& topology() const noexcept { return topology_; }
  // Whether messages to `peer` go through shared memory (Intra).
  bool is_local(int peer) const { return topology_.host(peer) == topology_.host(rank()); }

  Intra& intra() noexcept { return intra_; }
  Inter& inter() noexcept { return inter_; }
  // The job-wide transport's time (concepts::timed_transport).
  time_source time() const { return concepts::time_of(inter_); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    if (is_local(peer)) return request(std::in_place_index<1>, intra_.async_send(topology_.local_rank(peer), tag, bytes));
    return request(std::in_place_index<2>, inter_.async_send(peer, tag, bytes));
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    if (is_local(peer)) return request(std::in_place_index<1>, intra_.async_recv(topology_.local_rank(peer), tag, bytes));
    return request(std::in_place_index<2>, inter_.async_recv(peer, tag, bytes));
  }
  template <class V>
    requires concepts::accumulating_transport<Intra, V> && concepts::accumulating_transport<Inter, V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    if (is_local(peer)) return request(std::in_place_index<1>, intra_.async_recv_accumulate(topology_.local_rank(peer), tag, inout));
    return request(std::in_place_index<2>, inter_.async_recv_accumulate(peer, tag, inout));
  }

  // Waits on one transport while the other keeps moving: a rank that sleeps in Intra
  // while its peer across hosts waits for bytes that only Inter's progress (Asio's
  // writes, UCX's rendezvous replies) would move deadlocks the job. So the wait is taken
  // in slices, each followed by a short turn of the other transport (an empty wait_any:
  // it progresses and reports that transport's failures).
  void wait(request& r, deadline until) {
    if (auto* a = std::get_if<1>(&r.held_))
      wait_on(intra_, inter_, *a, until);
    else if (auto* b = std::get_if<2>(&r.held_))
      wait_on(inter_, intra_, *b, until);
    r.held_ = std::monostate{};
  }

  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    std::vector<typename Intra::request*> intra;
    std::vector<typename Inter::request*> inter;
    std::vector<std::size_t> intra_at, inter_at;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (auto* a = std::get_if<1>(&requests[i]->held_)) {
        intra.push_back(a);
        intra_at.push_back(i);
      } else if (auto* b = std::get_if<2>(&requests[i]->held_)) {
        inter.push_back(b);
        inter_at.push_back(i);
      }
    }
    if (intra.empty() && inter.empty()) throw error(errc::invalid_argument, "per_peer::wait_any: no request to wait for");
    for (;;) {
      const bool last = clock::now() >= until;
      if (auto i = ready_within(intra_, std::span<typename Intra::request* const>(intra), last ? until : clock::now() + slice)) return intra_at[*i];
      if (auto i = ready_within(inter_, std::span<typename Inter::request* const>(inter), last ? until : clock::now() + turn)) return inter_at[*i];
      if (last) throw error(errc::timeout, detail::wait_any_timeout_message(rank(), requests.size()));
    }
  }

  void fail(errc cause, const std::string& reason)
    requires concepts::failable_transport<Intra> && concepts::failable_transport<Inter>
  {
    intra_.fail(cause, reason);
    inter_.fail(cause, reason);
  }

  traffic_counters traffic() const
    requires concepts::metered_transport<Intra> && concepts::metered_transport<Inter>
  {
    traffic_counters t = intra_.traffic();
    t += inter_.traffic();
    return t;
  }

  void tolerate_loss(int peer)
    requires concepts::loss_tolerant_transport<Intra> && concepts::loss_tolerant_transport<Inter>
  {
    if (is_local(peer))
      intra_.tolerate_loss(topology_.local_rank(peer));
    else
      inter_.tolerate_loss(peer);
  }
  // In the job's ranks.
  std::vector<int> lost_peers() const
    requires concepts::loss_tolerant_transport<Intra> && concepts::loss_tolerant_transport<Inter>
  {
    std::vector<int> lost = inter_.lost_peers();
    const auto local = topology_.ranks_on(topology_.host(rank()));
    for (int r : intra_.lost_peers()) lost.push_back(local[static_cast<std::size_t>(r)]);
    std::sort(lost.begin(), lost.end());
    lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
    return lost;
  }
  bool tolerates_loss() const { return concepts::tolerates_loss(intra_) && concepts::tolerates_loss(inter_); }

  // How long a wait sleeps in one transport before it gives the other a turn, and how
  // long that turn lasts (it returns at once when nothing is ready there).
  static constexpr std::chrono::microseconds slice{500}, turn{50};

 private:
  // The index of a request among `rs` that completed by `until`, or none (`rs` may be
  // empty: then this only moves `t` along).
  template <class T, class R>
  static std::optional<std::size_t> ready_within(T& t, std::span<R* const> rs, deadline until) {
    try {
      return t.wait_any(rs, until);
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      return std::nullopt;
    }
  }

  template <class Mine, class Other, class R>
  void wait_on(Mine& mine, Other& other, R& r, deadline until) {
    R* const one[] = {&r};
    using other_request = typename Other::request;
    while (clock::now() < until) {
      if (ready_within(mine, std::span<R* const>(one), std::min(until, clock::now() + slice))) break;
      ready_within(other, std::span<other_request* const>(), clock::now() + turn);
    }
    mine.wait(r, until);  // finished, or past the deadline: the transport's own timeout
  }

  Intra intra_;
  Inter inter_;
  cluster::topology topology_;
};

// Over two stand-ins (concepts.hpp's archetypes); the shipped pair, per_peer<ucx, asio_tcp>,
// is asserted in cluster/per_peer.hpp, which has both.
static_assert(concepts::transport<per_peer<concepts::detail::multiplexing_transport_archetype,
                                           concepts::detail::multiplexing_transport_archetype>>);
static_assert(concepts::multiplexing_transport<per_peer<concepts::detail::multiplexing_transport_archetype,
                                                        concepts::detail::multiplexing_transport_archetype>> &&
              concepts::topology_aware_transport<per_peer<concepts::detail::multiplexing_transport_archetype,
                                                          concepts::detail::multiplexing_transport_archetype>>);

}  // namespace gradwire::transport
