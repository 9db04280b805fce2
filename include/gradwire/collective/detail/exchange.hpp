// Point-to-point building blocks of the collectives: send, receive, and both at once.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "../../concepts.hpp"
#include "../../kernels/host.hpp"
#include "../communicator.hpp"

namespace gradwire::collective::detail {

template <class Tr, class V>
void send(communicator<Tr>& comm, int peer, std::uint64_t tag, std::span<const V> data) {
  auto r = comm.transport().async_send(peer, tag, std::as_bytes(data));
  comm.transport().wait(r, comm.step_deadline());
}

template <class Tr, class V>
void recv(communicator<Tr>& comm, int peer, std::uint64_t tag, std::span<V> data) {
  auto r = comm.transport().async_recv(peer, tag, std::as_writable_bytes(data));
  comm.transport().wait(r, comm.step_deadline());
}

// Sends `out` to `to` while receiving `in` from `from`: the step of every ring
// algorithm. Both are posted before either is waited on, so a ring cannot deadlock.
template <class Tr, class V>
void send_recv(communicator<Tr>& comm, std::uint64_t tag, int to, std::span<const V> out, int from,
               std::span<V> in) {
  auto& t = comm.transport();
  auto r = t.async_recv(from, tag, std::as_writable_bytes(in));
  auto s = t.async_send(to, tag, std::as_bytes(out));
  const auto until = comm.step_deadline();
  t.wait(r, until);
  t.wait(s, until);
}

// A receive-and-add posted but not yet waited for: fused into delivery where the
// transport can, else staged (`staged` is added into `add_into` on completion).
template <class Tr, class V>
struct posted_accumulate {
  typename Tr::request recv;
  std::span<V> add_into, staged;
};

// Posts the receive of a message of inout.size() elements from `from`, to be added into
// `inout` (staged in `scratch` on transports that cannot add on delivery).
template <class Tr, class V>
posted_accumulate<Tr, V> post_recv_accumulate(communicator<Tr>& comm, std::uint64_t tag, int from, std::span<V> inout,
                                              std::span<V> scratch) {
  if constexpr (concepts::accumulating_transport<Tr, V>) {
    return {comm.transport().async_recv_accumulate(from, tag, inout), {}, {}};
  } else {
    auto staged = scratch.first(inout.size());
    return {comm.transport().async_recv(from, tag, std::as_writable_bytes(staged)), inout, staged};
  }
}

// Adds a completed receive's staged copy into place (nothing when it added on delivery).
template <class Tr, class V>
void add_staged(posted_accumulate<Tr, V>& p) {
  if (!p.staged.empty()) kernels::add(p.add_into.data(), p.staged.data(), p.add_into.size());
}

template <class Tr, class V>
void complete_accumulate(communicator<Tr>& comm, posted_accumulate<Tr, V>& p, deadline until) {
  comm.transport().wait(p.recv, until);
  add_staged(p);
}

// Receives a message of inout.size() elements from `from` and adds it into `inout`.
template <class Tr, class V>
void recv_accumulate(communicator<Tr>& comm, std::uint64_t tag, int from, std::span<V> inout, std::span<V> scratch) {
  auto p = post_recv_accumulate(comm, tag, from, inout, scratch);
  complete_accumulate(comm, p, comm.step_deadline());
}

// A send_recv, or a send with a receive-and-add, posted but not yet waited for, so that a pipelined
// collective can keep several steps in flight (the transports progress a rank's requests
// only while it waits). A staged receive-and-add needs staging of its own per exchange.
template <class Tr, class V>
struct posted_exchange {
  posted_accumulate<Tr, V> in;  // nothing staged when the receive copies into place
  typename Tr::request send;
};

// Posts the receive (added into `in` when `accumulate`, else copied into it) and the send.
template <class Tr, class V>
posted_exchange<Tr, V> post_exchange(communicator<Tr>& comm, std::uint64_t tag, int to, std::span<const V> out,
                                     int from, std::span<V> in, bool accumulate, std::span<V> scratch) {
  auto& t = comm.transport();
  auto received = accumulate ? post_recv_accumulate(comm, tag, from, in, scratch)
                             : posted_accumulate<Tr, V>{t.async_recv(from, tag, std::as_writable_bytes(in)), {}, {}};
  auto sent = t.async_send(to, tag, std::as_bytes(out));
  return {std::move(received), std::move(sent)};
}

template <class Tr, class V>
void complete_exchange(communicator<Tr>& comm, posted_exchange<Tr, V>& p, deadline until) {
  comm.transport().wait(p.in.recv, until);
  comm.transport().wait(p.send, until);
  add_staged(p.in);
}

}  // namespace gradwire::collective::detail
