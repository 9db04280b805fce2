// Point-to-point building blocks of the collectives: send, receive, and both at once.
#pragma once

#include <cstdint>
#include <span>

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

// Receives a message of inout.size() elements from `from` and adds it into `inout`:
// fused into delivery where the transport can, else staged in `scratch`.
template <class Tr, class V>
void recv_accumulate(communicator<Tr>& comm, std::uint64_t tag, int from, std::span<V> inout, std::span<V> scratch) {
  if constexpr (concepts::accumulating_transport<Tr, V>) {
    auto r = comm.transport().async_recv_accumulate(from, tag, inout);
    comm.transport().wait(r, comm.step_deadline());
  } else {
    auto in = scratch.first(inout.size());
    recv(comm, from, tag, in);
    kernels::add(inout.data(), in.data(), inout.size());
  }
}

// Like send_recv, but adds what arrives from `from` into `inout`: fused into delivery on
// transports that can (concepts::accumulating_transport), else staged in `scratch`.
template <class Tr, class V>
void send_recv_accumulate(communicator<Tr>& comm, std::uint64_t tag, int to, std::span<const V> out, int from,
                          std::span<V> inout, std::span<V> scratch) {
  if constexpr (concepts::accumulating_transport<Tr, V>) {
    auto& t = comm.transport();
    auto r = t.async_recv_accumulate(from, tag, inout);
    auto s = t.async_send(to, tag, std::as_bytes(out));
    const auto until = comm.step_deadline();
    t.wait(r, until);
    t.wait(s, until);
  } else {
    auto in = scratch.first(inout.size());
    send_recv(comm, tag, to, out, from, in);
    kernels::add(inout.data(), in.data(), inout.size());
  }
}

}  // namespace gradwire::collective::detail
