// The four policy seams of gradwire::strategy: tensor, optimizer, transport, aggregation.
//
// A policy (the library's or a user's) that satisfies a concept composes with every
// other policy; strategy<> checks each with a static_assert that says what is missing.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <utility>

#include "error.hpp"
#include "support/topology.hpp"
#include "support/traffic.hpp"
#include "tensor/dtype.hpp"
#include "tensor/shape.hpp"
#include "timeouts.hpp"

namespace gradwire {

namespace collective {
template <class Transport>
class communicator;
}

// Concepts live in their own namespace: their natural names (transport, aggregation)
// are also the names of the namespaces that hold the policies.
namespace concepts {

// Tensor: where parameters and gradients live.
//   value_type          float or double
//   location            static memory_location (host or cuda): picks the kernels
//   data(), size()      contiguous elements
//   shape()             extents, for checks and messages
template <class T>
concept tensor = requires(T& t, const T& ct) {
  typename T::value_type;
  requires std::floating_point<typename T::value_type>;
  { T::location } -> std::convertible_to<memory_location>;
  { t.data() } -> std::convertible_to<typename T::value_type*>;
  { ct.size() } -> std::convertible_to<std::size_t>;
  { ct.shape() } -> std::convertible_to<const shape&>;
};

template <class T>
concept host_tensor_type = tensor<T> && (T::location == memory_location::host);

// Optimizer: applied by whoever owns the variables, one tensor at a time.
//   template <class V> struct state;                  per-tensor state (moments, step count)
//   state<V> init<V>(size_t n) const                  fresh state for n elements
//   void step(state<V>&, span<V> params, span<const V> grads, V grad_scale) const
//                                                     params -= update(grad_scale * grads)
// grad_scale lets an aggregation fuse the 1/N of averaging into the step.
template <class O, class V>
concept optimizer = std::copy_constructible<O> &&
                    requires(const O& o, typename O::template state<V>& s, std::span<V> params,
                             std::span<const V> grads, V grad_scale, std::size_t n) {
                      { o.template init<V>(n) } -> std::same_as<typename O::template state<V>>;
                      o.step(s, params, grads, grad_scale);
                    };

// Transport: how bytes move between ranks. Operations start without waiting and are
// completed by wait(), which takes a deadline and throws gradwire::error (timeout,
// peer_lost, mismatch) instead of hanging. A request that is destroyed before it
// completes is cancelled, so buffers never outlive the operations that use them.
//   rank(), size()
//   request async_send(int peer, uint64_t tag, span<const byte>)
//   request async_recv(int peer, uint64_t tag, span<byte>)   sizes must match the send
//   void wait(request&, deadline)
// Tags are below 2^48 - 1 (UCX carries the sender's rank in the upper bits of its tag).
// Requests: some algorithms also need `explicit operator bool` (a request still to be
// waited for: the parameter server, the one-shot all-reduce) and a default-constructible,
// move-assignable request (any_transport); the library's transports have all three.
template <class T>
concept transport = std::move_constructible<T> &&
                    requires(T& t, const T& ct, int peer, std::uint64_t tag, std::span<const std::byte> out,
                             std::span<std::byte> in, typename T::request& request, deadline until) {
                      { ct.rank() } -> std::convertible_to<int>;
                      { ct.size() } -> std::convertible_to<int>;
                      { t.async_send(peer, tag, out) } -> std::same_as<typename T::request>;
                      { t.async_recv(peer, tag, in) } -> std::same_as<typename T::request>;
                      t.wait(request, until);
                    };

// Optional transport capability: receive a message of V and add it into memory in the
// same pass that delivers it (inout[i] += message[i]). Reductions use it when present
// and otherwise receive into scratch and add, one more pass over memory.
//   request async_recv_accumulate(int peer, uint64_t tag, span<V> inout)
template <class T, class V>
concept accumulating_transport = transport<T> && requires(T& t, int peer, std::uint64_t tag, std::span<V> inout) {
  { t.async_recv_accumulate(peer, tag, inout) } -> std::same_as<typename T::request>;
};

// Optional transport capability: mark this rank failed and tell the peers why, so that
// every rank reports the root cause (say, a collective mismatch that only the two
// neighbours can see) instead of a bare lost peer.
//   void fail(errc cause, const std::string& reason)
template <class T>
concept failable_transport = transport<T> && requires(T& t, errc cause, const std::string& reason) {
  t.fail(cause, reason);
};

// Optional transport capability: wait for whichever of several requests completes first
// (a server that answers many clients in arrival order needs it). Returns the index of a
// request that wait() then finishes without blocking.
//   size_t wait_any(span<request* const>, deadline)
template <class T>
concept multiplexing_transport =
    transport<T> && requires(T& t, std::span<typename T::request* const> requests, deadline until) {
      { t.wait_any(requests, until) } -> std::convertible_to<std::size_t>;
    };

// Optional transport capability: survive the loss of a peer that the rank can do without
// (operations with it fail with peer_lost; the rest go on), and say which were lost.
//   void tolerate_loss(int peer)      vector<int> lost_peers() const
template <class T>
concept loss_tolerant_transport = transport<T> && requires(T& t, const T& ct, int peer) {
  t.tolerate_loss(peer);
  { ct.lost_peers() } -> std::convertible_to<std::vector<int>>;
};

// Optional capability of a loss-tolerant transport: take back a process that replaces a
// lost peer (a restarted worker), and tell a process that it is such a replacement.
//   void allow_rejoin(int peer)       bool rejoined() const
template <class T>
concept rejoinable_transport = loss_tolerant_transport<T> && requires(T& t, const T& ct, int peer) {
  t.allow_rejoin(peer);
  { ct.rejoined() } -> std::convertible_to<bool>;
};

// Whether `t` joined as the replacement of a lost rank (rejoinable_transport): such a
// process skips the collectives the others ran when the job started.
template <class T>
bool rejoined(const T& t) {
  if constexpr (rejoinable_transport<T>)
    return t.rejoined();
  else
    return false;
}

// Whether `t` can lose a peer and go on: its type says so (loss_tolerant_transport), and a
// transport whose answer depends on what it wraps (any_transport) may narrow it at run
// time with `bool tolerates_loss() const`.
template <class T>
bool tolerates_loss(const T& t) {
  if constexpr (!loss_tolerant_transport<T>)
    return false;
  else if constexpr (requires { { t.tolerates_loss() } -> std::convertible_to<bool>; })
    return t.tolerates_loss();
  else
    return true;
}

// Optional transport capability: count the payload this rank has sent and received, so
// that a strategy can report bytes per step (a transport without it reports none).
//   support::traffic_counters traffic() const
template <class T>
concept metered_transport = transport<T> && requires(const T& ct) {
  { ct.traffic() } -> std::convertible_to<support::traffic_counters>;
};

// Optional transport capability: one-sided access to memory a peer exposed (RMA). A
// parameter server takes it for push and pull to the peers the transport prefers it for
// (a worker puts its gradient into the server's memory and gets the parameters back;
// the server's loop copies nothing through messages).
//   memory_window expose(span<byte>)           span<const byte> key() const: for a peer's attach()
//   remote_window attach(int peer, span<const byte> key)
//   request async_put(remote_window&, size_t offset, span<const byte>)  done: in the peer's memory
//   request async_get(remote_window&, size_t offset, span<byte>)        done: here
//   bool prefers_one_sided(int peer) const     put/get beat tagged messages to that peer
template <class T>
concept one_sided_transport =
    transport<T> && requires(T& t, const T& ct, int peer, std::size_t offset, std::span<std::byte> memory,
                             std::span<const std::byte> bytes, typename T::memory_window& window,
                             typename T::remote_window& remote) {
      { t.expose(memory) } -> std::same_as<typename T::memory_window>;
      { std::as_const(window).key() } -> std::convertible_to<std::span<const std::byte>>;
      { t.attach(peer, bytes) } -> std::same_as<typename T::remote_window>;
      { t.async_put(remote, offset, bytes) } -> std::same_as<typename T::request>;
      { t.async_get(remote, offset, memory) } -> std::same_as<typename T::request>;
      { ct.prefers_one_sided(peer) } -> std::convertible_to<bool>;
    };

// Optional transport capability: the ranks are threads of one process, so a pointer
// means the same memory on every rank (device pointers too). Device collectives then
// read and write each other's buffers directly instead of sending bytes.
//   static constexpr bool shares_address_space = true
template <class T>
concept shared_address_space_transport = transport<T> && requires {
  requires T::shares_address_space;
};

// Optional transport capability: which ranks share a host (learnt at join, e.g. from a
// host identity every rank publishes). The communicator exposes it (local rank, local
// size, host index) and hierarchical all-reduce splits its work by it; a transport
// without it counts as one host.
//   const cluster::topology& topology() const
template <class T>
concept topology_aware_transport = transport<T> && requires(const T& ct) {
  { ct.topology() } -> std::convertible_to<const cluster::topology&>;
};

namespace detail {
// Stands in for the callback strategy<> hands an aggregation: apply(i, grad, scale)
// runs the optimizer on parameter tensor i with grad * scale.
template <class V>
struct apply_archetype {
  void operator()(std::size_t, std::span<const V>, V) const {}
};
// Stands in for an optimizer, where a hook takes one.
struct optimizer_archetype {};
}  // namespace detail

// Aggregation: how replicas agree on an update. A policy (the type a user names: the
// settings) and an agent (one replica's state for one job, typed on the value type V and
// the Transport; strategy<> builds it from the policy), as CUB splits a policy from its
// per-block agent. An aggregation is one of:
//
// (a) incremental: `typename A::template agent<V, Tr>`, constructible from `const A&`, an
//     aggregation_agent. Communication may start while backward still runs.
// (b) whole-step: setup(comm, params) and step(comm, params, grads, apply) on A itself
//     (the tutorial's top-k). strategy<> wraps it in aggregation::whole_step_agent, which
//     hands it every gradient at finish, so it composes with the incremental API too.

// Agent of an incremental aggregation:
//   setup(comm, params)               collective, once: make replicas start equal
//   begin_step(comm)                  a step starts (forget the last one's readiness)
//   ready(comm, i, grad)              gradient i is final for this step: may start
//                                     communicating it. Once per tensor per step, in any
//                                     order, from any thread, but never concurrently (the
//                                     strategy serialises). grad stays valid and unchanged
//                                     until finish_step returns.
//   finish_step(comm, params, apply)  every tensor was ready: complete the step and call
//                                     apply(i, grad_i, scale) where this rank updates
// params and grads are per-tensor spans, in the same order on every rank. apply runs the
// optimizer before it returns and keeps no reference to grad_i. Optional hooks each have
// a named concept below.
template <class G, class V, class Transport>
concept aggregation_agent =
    std::move_constructible<G> &&
    requires(G& g, collective::communicator<Transport>& comm, std::span<const std::span<V>> params, std::size_t i,
             std::span<const V> grad, detail::apply_archetype<V> apply) {
      g.setup(comm, params);
      g.begin_step(comm);
      g.ready(comm, i, grad);
      g.finish_step(comm, params, apply);
    };

template <class A, class V, class Transport>
concept incremental_aggregation =
    std::copy_constructible<A> && requires { typename A::template agent<V, Transport>; } &&
    std::constructible_from<typename A::template agent<V, Transport>, const A&> &&
    aggregation_agent<typename A::template agent<V, Transport>, V, Transport>;

template <class A, class V, class Transport>
concept whole_step_aggregation =
    std::move_constructible<A> &&
    requires(A& a, collective::communicator<Transport>& comm, std::span<const std::span<V>> params,
             std::span<const std::span<const V>> grads, detail::apply_archetype<V> apply) {
      a.setup(comm, params);
      a.step(comm, params, grads, apply);
    };

template <class A, class V, class Transport>
concept aggregation = incremental_aggregation<A, V, Transport> || whole_step_aggregation<A, V, Transport>;

// Optional hooks of an agent (or of a whole-step aggregation, which its wrapper forwards).
// strategy<> uses each one through its concept, never by probing.

// Parameters change only in apply() (all-reduce, local): a strategy over device tensors
// keeps them on the device instead of mirroring them through the host around a step.
//   static constexpr bool updates_only_through_apply = true
template <class G>
concept updates_only_through_apply = requires {
  requires G::updates_only_through_apply;
};

// A replica that leaves the job says so (a parameter-server worker tells the servers,
// which stop waiting for it). strategy<>'s destructor calls it.
//   void finish(comm)
template <class G, class Transport>
concept finishing_agent = requires(G& g, collective::communicator<Transport>& comm) { g.finish(comm); };

// Some ranks serve instead of stepping (parameter servers): strategy<>::is_server() and
// serve() forward here.
//   bool is_server(int rank, int size) const
//   auto serve(comm, params, const Optimizer&)   runs until the workers are done
template <class G, class V, class Transport, class Optimizer>
concept serving_agent = requires(G& g, const G& cg, collective::communicator<Transport>& comm,
                                 std::span<const std::span<V>> params, const Optimizer& optimizer) {
  { cg.is_server(0, 1) } -> std::convertible_to<bool>;
  g.serve(comm, params, optimizer);
};

// Keeps the replicas' optimizer state in step too (local SGD's average_optimizer_state):
// called after every step with this replica's states, one per tensor.
//   void synchronise_state<V>(comm, span<State>)
//   bool averages_optimizer_state() const        whether it touches the states at all
template <class G, class V, class Transport, class State>
concept state_synchronising_agent =
    requires(G& g, const G& cg, collective::communicator<Transport>& comm, std::span<State> states) {
      g.template synchronise_state<V>(comm, states);
      { cg.averages_optimizer_state() } -> std::convertible_to<bool>;
    };

// Reports how stale this replica's latest gradient was when it was applied (parameter
// servers), for the step's stats.
//   uint64_t last_staleness() const
template <class G>
concept staleness_reporting_agent = requires(const G& g) {
  { g.last_staleness() } -> std::convertible_to<std::uint64_t>;
};

// A parameter server's consistency mode (gradwire/ps/modes.hpp has the library's four).
//   static const char* name       for logs and reports
//   static bool on_arrival        apply each gradient as it arrives (else a step applies the mean)
//   static int backups            how many late workers a step can do without (sync modes)
//   static int max_lead           how far a worker may run ahead of the slowest live one (-1: unbounded)
template <class M>
concept ps_mode = requires {
  { M::name } -> std::convertible_to<const char*>;
  { M::on_arrival } -> std::convertible_to<bool>;
  { M::backups } -> std::convertible_to<int>;
  { M::max_lead } -> std::convertible_to<int>;
};

}  // namespace concepts
}  // namespace gradwire
