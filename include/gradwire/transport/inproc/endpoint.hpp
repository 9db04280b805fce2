// One in-process rank's endpoint (transport::inproc): posts to and waits on the group's hub (hub.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "../../clock.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../support/topology.hpp"
#include "../detail/deliver.hpp"
#include "../detail/messages.hpp"
#include "../detail/pending_request.hpp"
#include "../traffic.hpp"
#include "hub.hpp"

namespace gradwire::transport {

// One rank's endpoint. Cheap to copy; all endpoints of a group share one hub.
class inproc {
 public:
  using request = detail::pending_request<detail::inproc_hub, detail::inproc_op>;
  // Ranks are threads of this process: device collectives share buffers directly.
  static constexpr bool shares_address_space = true;
  // The ring all-reduce pipelines its parts in segments of this many bytes
  // (collective/detail/ring.hpp): a segment is received, added and sent on while it is
  // still in cache. 64 KiB beat 32, 128 and 256 (2-core VM, benchmarks/allreduce_inproc,
  // medians of 6 interleaved runs, unpipelined -> pipelined: 2 ranks 1 MiB 123 -> 77 us,
  // 4 MiB 328 -> 159, 16 MiB 2227 -> 1267; 4 ranks 4 MiB 1015 -> 871).
  static constexpr std::size_t ring_segment_bytes = 64 * 1024;

  inproc(std::shared_ptr<detail::inproc_hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {
    if (!hub_ || rank_ < 0 || rank_ >= hub_->size())
      throw error(errc::invalid_argument, "inproc: rank " + std::to_string(rank_) + " outside the group");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return hub_->size(); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    // The sender's buffer is only ever read (it is the memcpy source).
    return post(true, peer, tag, const_cast<std::byte*>(bytes.data()), bytes.size());
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    return post(false, peer, tag, bytes.data(), bytes.size());
  }
  // Receives a message of inout.size() elements and adds it into inout (inout[i] +=
  // message[i]) in the same pass that moves it: no staging copy.
  template <class V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return post(false, peer, tag, reinterpret_cast<std::byte*>(inout.data()), inout.size_bytes(),
                &detail::deliver_accumulate<V>);
  }
  void wait(request& r, deadline until) {
    const auto op = r.take();
    if (!op) throw error(errc::invalid_argument, "inproc: wait on an empty or already finished request");
    hub_->wait(*op, until);
  }

  // Returns the index of one of `requests` that wait() completes without waiting for a peer.
  std::size_t wait_any(std::span<request* const> requests, deadline until) {
    return hub_->wait_any(
        requests.size(), [&](std::size_t i) { return requests[i] ? requests[i]->peek() : nullptr; }, rank_, until);
  }

  // Marks this rank failed so that peers stop waiting for it (see inproc_group::run).
  void fail(errc cause, const std::string& reason) { hub_->fail(rank_, cause, reason); }

  // Payload this rank has sent and received (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }

  // The hosts the group's threads pretend to be on (inproc_group's topology; one host
  // unless a test says otherwise): concepts::topology_aware_transport.
  const cluster::topology& topology() const noexcept { return hub_->topology(); }

 private:
  request post(bool is_send, int peer, std::uint64_t tag, std::byte* data, std::size_t bytes,
               detail::deliver_fn deliver = &detail::deliver_copy) {
    detail::check_peer("inproc", rank_, peer, size());
    detail::check_tag("inproc", tag);
    auto op = detail::make_operation<detail::inproc_op>(is_send, rank_, peer, tag, data, bytes, deliver);
    hub_->post(*op);
    is_send ? traffic_.sent(bytes) : traffic_.received(bytes);
    return request(hub_, std::move(op));
  }

  std::shared_ptr<detail::inproc_hub> hub_;
  int rank_;
  traffic_counters traffic_;
};

static_assert(concepts::transport<inproc>);
static_assert(concepts::accumulating_transport<inproc, float> && concepts::accumulating_transport<inproc, double>);
static_assert(concepts::failable_transport<inproc> && concepts::multiplexing_transport<inproc>);
static_assert(concepts::shared_address_space_transport<inproc> && concepts::metered_transport<inproc>);
static_assert(concepts::topology_aware_transport<inproc>);
static_assert(concepts::segmenting_transport<inproc>);  // the ring pipelines its parts in segments

}  // namespace gradwire::transport
