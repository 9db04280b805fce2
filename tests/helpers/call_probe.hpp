// Test helper: a transport wrapper that records what each collective told its peers (the call
// check's descriptor: operation, count, algorithm) and counts check frames apart from data.
//
// It forwards every capability of the transport it wraps (fused receive-and-add, topology,
// failure propagation, traffic counters, the ring's segment size), so a collective runs over
// it exactly as over the transport itself. Tests use it to assert which algorithm an
// implicit choice (all_reduce<auto_>, reduce's tree or scatter-gather) really ran, and that
// communicator_options::verify = false sends no check frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradwire/collective/detail/ring.hpp>
#include <gradwire/collective/verify.hpp>
#include <gradwire/concepts.hpp>

namespace gradwire::test {

// What one rank sent, collective by collective.
struct call_log {
  // The descriptor of each collective this rank ran with the call check on (> 1 rank): the
  // one in its frame to its right neighbour (every checked collective sends exactly one).
  std::vector<collective::call_descriptor> calls;
  std::size_t check_frames = 0;   // messages on the check's tags (neighbour and far frames)
  std::size_t data_messages = 0;  // every other message
  std::size_t data_bytes = 0;

  std::vector<collective::algorithm_id> algorithms() const {
    std::vector<collective::algorithm_id> out;
    for (const auto& c : calls) out.push_back(c.algorithm);
    return out;
  }
};

// Whether a message tag is one of the call check's (verify.hpp: the top steps of an operation).
inline bool is_check_tag(std::uint64_t tag) noexcept {
  return (tag & 0xffff) >= collective::detail::verify_from_left;
}

template <class Inner>
struct call_probe {
  using request = typename Inner::request;
  // The same pipelining as the transport wrapped (0: none), so the ring cuts alike.
  static constexpr std::size_t ring_segment_bytes = collective::detail::ring_segment_bytes_of<Inner>();

  Inner inner;
  call_log* log;

  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    if (is_check_tag(tag)) {
      ++log->check_frames;
      if ((tag & 0xffff) == collective::detail::verify_from_left && bytes.size() >= sizeof(collective::call_descriptor)) {
        collective::call_descriptor d;
        std::memcpy(&d, bytes.data(), sizeof d);
        log->calls.push_back(d);
      }
    } else {
      ++log->data_messages;
      log->data_bytes += bytes.size();
    }
    return inner.async_send(peer, tag, bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) { return inner.async_recv(peer, tag, bytes); }
  template <class V>
    requires concepts::accumulating_transport<Inner, V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return inner.async_recv_accumulate(peer, tag, inout);
  }
  void wait(request& r, deadline until) { inner.wait(r, until); }

  const cluster::topology& topology() const
    requires concepts::topology_aware_transport<Inner>
  {
    return inner.topology();
  }
  void fail(errc cause, const std::string& reason)
    requires concepts::failable_transport<Inner>
  {
    inner.fail(cause, reason);
  }
  support::traffic_counters traffic() const
    requires concepts::metered_transport<Inner>
  {
    return inner.traffic();
  }
};

}  // namespace gradwire::test
