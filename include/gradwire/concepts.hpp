// The four policy seams of gradwire::strategy: tensor, optimizer, transport, aggregation.
//
// A policy (the library's or a user's) that satisfies a concept composes with every
// other policy; strategy<> checks each with a static_assert that says what is missing.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>
#include <utility>

#include "clock.hpp"
#include "error.hpp"
#include "support/topology.hpp"
#include "support/traffic.hpp"
#include "tensor/dtype.hpp"
#include "tensor/element_range.hpp"
#include "tensor/shape.hpp"

namespace gradwire {

namespace collective {
template <class Transport>
class communicator;
}
namespace optim {
template <class O, class T>
struct device_state;  // an optimizer's state on the device: optim/cuda.cuh
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

// Gradient: what strategy<>::step and step.ready take for a parameter tensor of V: a
// tensor, or anything a std::span<const V> can view (a std::vector<V>, a span, an array).
template <class G, class V>
concept gradient = tensor<std::remove_const_t<G>> || requires(const G& g) { std::span<const V>(g); };

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

// Optional optimizer capability: a learning-rate schedule may change its rate between steps
// (strategy::serve(schedule), where its absence is a compile error; ps::options::learning_rate,
// checked when the server starts; optim::one_of).
//   void set_lr(double)
template <class O>
concept schedulable_optimizer = requires(O& o) { o.set_lr(1.0); };

namespace detail {
// Stands in for the visitor a checkpoint or an aggregation hands an optimizer state.
struct state_visitor_archetype {
  template <class S>
  void operator()(S&&) const {}
};
}  // namespace detail

// Optimizer state that shows its buffers (velocity, moments): for_each_buffer(f) calls
// f(span<V>) once per buffer, f(span<const V>) on a const state. Checkpoints save them and
// local SGD's average_optimizer_state averages them. S may be const.
//   void for_each_buffer(F&& f)
template <class S>
concept buffer_visiting_state = requires(S& s) { s.for_each_buffer(detail::state_visitor_archetype{}); };

// Optimizer state that shows its step counters (Adam's step): for_each_counter(f) calls
// f(long&) once per counter, f(const long&) on a const state. S may be const.
//   void for_each_counter(F&& f)
template <class S>
concept counter_visiting_state = requires(S& s) { s.for_each_counter(detail::state_visitor_archetype{}); };

// An optimizer named by its type (O::name), not by the instance (o.name(): optim::one_of).
//   static const char* name (or anything convertible to string_view)
template <class O>
concept named_by_type = requires { { O::name } -> std::convertible_to<std::string_view>; };

// Optimizer whose state a checkpoint can save: a name (static O::name, or o.name() for one
// chosen at run time: optim::one_of), and per-tensor state that shows its buffers and
// step counters, through a state and through a const one.
template <class O, class V>
concept checkpointable_optimizer =
    optimizer<O, V> &&
    (named_by_type<O> || requires(const O& o) { { o.name() } -> std::convertible_to<std::string_view>; }) &&
    buffer_visiting_state<typename O::template state<V>> &&
    buffer_visiting_state<const typename O::template state<V>> &&
    counter_visiting_state<typename O::template state<V>> && counter_visiting_state<const typename O::template state<V>>;

// What a checkpoint saves: a strategy, or a parameter server's shard. value_type,
// optimizer_type, parameters() (contiguous tensors or spans) and optimizer_states()
// (one state per parameter tensor); optimizer() too where the optimizer's name is chosen
// at run time (optim::one_of).
template <class M>
concept checkpoint_model = requires(M& m, const M& cm) {
  typename M::value_type;
  typename M::optimizer_type;
  m.parameters();
  m.optimizer_states();
  cm.parameters();
  cm.optimizer_states();
};

// An optimizer with a device path (optim/cuda.cuh says how one is written): its state for
// one tensor in device memory, and a fused step over k gradients, both queued on a Stream.
// Stream is a parameter so that this header needs no CUDA: optim/cuda.cuh names
// device_optimizer<O, V>, this with cudaStream_t.
//   optim::device_state<O, V>                                   found by ADL, as these:
//   void init_device(const O&, device_state<O, V>& fresh, size_t n, Stream)
//   void step_device(const O&, device_state<O, V>&, V* params, span<const V* const> grads,
//                    size_t n, V grad_scale, Stream)
template <class O, class V, class Stream>
concept device_optimizer_on =
    optimizer<O, V> && requires(const O& o, optim::device_state<O, V>& s, V* params, std::span<const V* const> grads,
                                std::size_t n, V grad_scale, Stream stream) {
      init_device(o, s, n, stream);
      step_device(o, s, params, grads, n, grad_scale, stream);
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

// Clock: where a rank's time comes from (clock.hpp's time_source is the one shipped: the
// steady clock, or a simulated rank's virtual time).
//   deadline now() const                       deadline deadline_after(milliseconds) const
//   bool runs_background_inline() const        deadline run_in_background(void (*)(void*), void*) const
//   void advance_to(deadline) const            void step_began() const
template <class C>
concept clock_source = std::copy_constructible<C> && requires(const C& c, std::chrono::milliseconds timeout,
                                                              deadline when, void (*work)(void*), void* context) {
  { c.now() } -> std::same_as<deadline>;
  { c.deadline_after(timeout) } -> std::same_as<deadline>;
  { c.runs_background_inline() } -> std::convertible_to<bool>;
  { c.run_in_background(work, context) } -> std::same_as<deadline>;
  c.advance_to(when);
  c.step_began();
};
static_assert(clock_source<time_source>);

// Optional transport capability: a time of its own (a simulated rank's endpoint: virtual
// time). A transport without it runs on the steady clock. Wrappers (any_transport,
// per_peer) pass on what they wrap.
//   time_source time() const
template <class T>
concept timed_transport = requires(const T& ct) {
  { ct.time() } -> std::convertible_to<time_source>;
};

// The time `t` runs on: what every deadline, step timing, trace and background collective
// of a rank is measured with (clock.hpp). Takes a transport or a communicator.
template <class T>
time_source time_of(const T& t) {
  if constexpr (timed_transport<T>)
    return t.time();
  else
    return {};
}

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

// Optional capability of a loss-tolerant transport: of the lost peers, those whose process is
// gone for sure (a closed or reset connection, its own abort), not merely silent (a
// partition, a stopped process): a peer gone for sure cannot go on as another job.
//   vector<int> gone_peers() const
template <class T>
concept certain_loss_transport = loss_tolerant_transport<T> && requires(const T& ct) {
  { ct.gone_peers() } -> std::convertible_to<std::vector<int>>;
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

// Optional capability of a loss-tolerant transport whose answer depends on what it wraps
// (any_transport, per_peer): says at run time whether it can lose a peer after all.
//   bool tolerates_loss() const
template <class T>
concept conditionally_loss_tolerant_transport = loss_tolerant_transport<T> && requires(const T& ct) {
  { ct.tolerates_loss() } -> std::convertible_to<bool>;
};

// Whether `t` can lose a peer and go on: its type says so (loss_tolerant_transport), and a
// conditionally_loss_tolerant_transport may narrow that at run time.
template <class T>
bool tolerates_loss(const T& t) {
  if constexpr (conditionally_loss_tolerant_transport<T>)
    return t.tolerates_loss();
  else
    return loss_tolerant_transport<T>;
}

// Whether `t` has lost `rank` (a tolerated peer gone; never, for a transport that cannot
// lose one): how a rank tells a lost peer from a failure of its own.
template <class T>
bool has_lost(const T& t, int rank) {
  if constexpr (loss_tolerant_transport<T>) {
    for (int lost : t.lost_peers())
      if (lost == rank) return true;
  }
  return false;
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

// Optional capability of a one_sided_transport's remote_window: how many bytes the peer
// exposed, so that a parameter-server worker can refuse a window too small for its shard
// (a model that differs between ranks) before it puts past its end.
//   size_t size() const
template <class W>
concept sized_remote_window = requires(const W& w) {
  { w.size() } -> std::convertible_to<std::size_t>;
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

// Optional transport capability: the ring all-reduce pipelines each part in segments of
// this many bytes (0: step by step), forwarding a segment while the rest of its part still
// arrives. A transport declares it where a segment costs no more than its bytes (inproc: a
// segment received, added and sent on is still in cache); over sockets the extra messages
// cost more than the overlap gains (docs/perf/tcp.md).
//   static constexpr size_t ring_segment_bytes
template <class T>
concept segmenting_transport = transport<T> && requires {
  { T::ring_segment_bytes } -> std::convertible_to<std::size_t>;
};

// ---- Rendezvous store -------------------------------------------------------------------
// The key-value store ranks meet through while they join a job (Gloo's Store): each rank
// publishes under keys of its own and reads the other ranks' keys, waiting for those not
// set yet. rendezvous::store_client (rank 0's TCP store) is the library's; a store of
// one's own (a file on shared storage, Redis, a scheduler's key-value service) fits the
// functions that take this concept (rendezvous::exchange_topology). Values are bytes; a
// key is set once. Strings travel as their bytes.
//   void set(const string& key, span<const byte> value)   publish value under key
//   vector<byte> get(const string& key)                   the value, once some rank has set
//                                                         key; past the timeout it throws
//                                                         gradwire::error with errc::timeout
//   void set_timeout(chrono::milliseconds)                how long each later call may wait
//                                                         (the join sets what is left of its
//                                                         deadline before each call)
template <class S>
concept rendezvous_store = requires(S& s, const std::string& key, std::span<const std::byte> value,
                                    std::chrono::milliseconds timeout) {
  s.set(key, value);
  { s.get(key) } -> std::convertible_to<std::vector<std::byte>>;
  s.set_timeout(timeout);
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
// Stands in for the agent a replica sets up over its host view: setup(comm, params).
struct setup_archetype {
  template <class Comm, class Params>
  void setup(Comm&, Params) {}
};
// Stands in for what a strategy runs on a replica's host view (a parameter server's serve).
struct host_work_archetype {
  void operator()() const {}
};

// Stands in for a transport where a policy checks itself (the aggregations' static_asserts):
// concepts::transport and no optional capability, so a check against it proves that the
// policy asks nothing more of a transport than the concept says. Never run.
struct transport_archetype {
  struct request {};
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  request async_send(int, std::uint64_t, std::span<const std::byte>) { return {}; }
  request async_recv(int, std::uint64_t, std::span<std::byte>) { return {}; }
  void wait(request&, deadline) {}
};
// The same with wait_any and nothing else: for a policy whose agent needs a
// multiplexing_transport (the parameter server's).
struct multiplexing_transport_archetype : transport_archetype {
  std::size_t wait_any(std::span<request* const>, deadline) { return 0; }
};
}  // namespace detail

static_assert(transport<detail::transport_archetype>);
static_assert(!accumulating_transport<detail::transport_archetype, float> &&
              !failable_transport<detail::transport_archetype> && !multiplexing_transport<detail::transport_archetype> &&
              !loss_tolerant_transport<detail::transport_archetype> && !metered_transport<detail::transport_archetype> &&
              !one_sided_transport<detail::transport_archetype> &&
              !shared_address_space_transport<detail::transport_archetype> &&
              !topology_aware_transport<detail::transport_archetype> && !segmenting_transport<detail::transport_archetype>);
static_assert(multiplexing_transport<detail::multiplexing_transport_archetype> &&
              !accumulating_transport<detail::multiplexing_transport_archetype, float> &&
              !failable_transport<detail::multiplexing_transport_archetype> &&
              !loss_tolerant_transport<detail::multiplexing_transport_archetype> &&
              !metered_transport<detail::multiplexing_transport_archetype> &&
              !one_sided_transport<detail::multiplexing_transport_archetype> &&
              !shared_address_space_transport<detail::multiplexing_transport_archetype> &&
              !topology_aware_transport<detail::multiplexing_transport_archetype> &&
              !segmenting_transport<detail::multiplexing_transport_archetype>);

// Aggregation: how replicas agree on an update. A policy (the type a user names: the
// settings) and an agent (one replica's state for one job, typed on the value type V and
// the Transport; strategy<> builds it from the policy), as CUB splits a policy from its
// per-block agent. An aggregation is one of:
//
// (a) incremental: `typename A::template agent<V, Tr>`, constructible from `const A&`, an
//     aggregation_agent. Communication may start while backward still runs.
// (b) whole-step: setup(comm, params) and step(comm, params, grads, apply) on A itself
//     (a user's own, written in one piece). strategy<> wraps it in aggregation::whole_step_agent, which
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
// which stop waiting for it; streaming DiLoCo warns of updates never flushed).
// strategy<>'s destructor calls it.
//   void finish(comm)
template <class G, class Transport>
concept finishing_agent = requires(G& g, collective::communicator<Transport>& comm) { g.finish(comm); };

// Owes updates when training stops (streaming DiLoCo: fragments whose all-reduce has run and
// whose update lands some steps later): flush applies them now. strategy<>::flush() forwards
// here, between steps.
//   void flush(comm, params)      params: the host view, as finish_step's
template <class G, class V, class Transport>
concept flushing_agent = requires(G& g, collective::communicator<Transport>& comm, std::span<const std::span<V>> params) {
  g.flush(comm, params);
};

// Keeps state of its own that training needs to go on exactly after a restore (DiLoCo: the
// anchor, the outer optimizer's state, the pending fragments, the step count):
// save_checkpoint and load_checkpoint carry it in the strategy's file (checkpoint.hpp,
// format version 2; a strategy without such an agent writes version 1).
//   std::string checkpoint_kind() const   the state and the settings it fits (a file of
//                                         another kind is refused)
//   void for_each_checkpoint_buffer(f)    f(span<V>) per buffer; f(span<const V>) when const
//   void for_each_checkpoint_counter(f)   f(uint64_t&) per counter; f(const uint64_t&) when const
//   void wait_in_flight(comm)             waits for what it runs in the background, after
//                                         which the state is final (until then the visitors
//                                         may refuse with errc::invalid_argument)
template <class G, class Transport>
concept checkpointing_agent = requires(G& g, const G& cg, collective::communicator<Transport>& comm) {
  { cg.checkpoint_kind() } -> std::convertible_to<std::string>;
  g.for_each_checkpoint_buffer(detail::state_visitor_archetype{});
  cg.for_each_checkpoint_buffer(detail::state_visitor_archetype{});
  g.for_each_checkpoint_counter(detail::state_visitor_archetype{});
  cg.for_each_checkpoint_counter(detail::state_visitor_archetype{});
  g.wait_in_flight(comm);
};

// A checkpoint_model whose aggregation keeps such state (strategy<> over a
// checkpointing_agent): aggregation() gives the agent, communicator() what it runs on.
template <class M>
concept checkpoint_model_with_agent_state = checkpoint_model<M> && requires(M& m, const M& cm) {
  typename M::transport_type;
  m.communicator();
  cm.aggregation();
  requires checkpointing_agent<std::remove_cvref_t<decltype(cm.aggregation())>, typename M::transport_type>;
};

// Some ranks serve instead of stepping (parameter servers): says which. strategy<>::is_server()
// forwards here; it needs no optimizer, unlike serve().
//   bool is_server(int rank, int size) const
template <class G>
concept server_choosing_agent = requires(const G& cg) {
  { cg.is_server(0, 1) } -> std::convertible_to<bool>;
};

// ...and serves on those ranks: strategy<>::serve() forwards here.
//   auto serve(comm, params, const Optimizer&)   runs until the workers are done
template <class G, class V, class Transport, class Optimizer>
concept serving_agent = server_choosing_agent<G> && requires(G& g, collective::communicator<Transport>& comm,
                                                             std::span<const std::span<V>> params,
                                                             const Optimizer& optimizer) {
  g.serve(comm, params, optimizer);
};

// ...and runs a learning-rate schedule on those ranks: strategy<>::serve(schedule) forwards
// here, and only where Optimizer is a schedulable_optimizer (the rate is set through it).
//   auto serve(comm, params, const Optimizer&, schedule)   lr = schedule(version, applied)
//                                                          before each update
template <class G, class V, class Transport, class Optimizer>
concept scheduling_agent =
    serving_agent<G, V, Transport, Optimizer> &&
    requires(G& g, collective::communicator<Transport>& comm, std::span<const std::span<V>> params,
             const Optimizer& optimizer, double (*schedule)(std::uint64_t version, std::uint64_t applied)) {
      g.serve(comm, params, optimizer, schedule);
    };

// Says whether it keeps the replicas' optimizer state in step (local SGD's
// average_optimizer_state, elastic_all_reduce's joins): a question without a state type,
// asked before any step.
//   bool averages_optimizer_state() const        whether it touches the states at all
template <class G>
concept state_averaging_agent = requires(const G& cg) {
  { cg.averages_optimizer_state() } -> std::convertible_to<bool>;
};

// ...and does it: called after setup and after every step with this replica's states, one
// per tensor (local SGD averages them; an elastic all-reduce hands them to a replacement).
//   void synchronise_state<V>(comm, span<State>)
template <class G, class V, class Transport, class State>
concept state_synchronising_agent =
    state_averaging_agent<G> && requires(G& g, collective::communicator<Transport>& comm, std::span<State> states) {
      g.template synchronise_state<V>(comm, states);
    };

// Reports how stale this replica's latest gradient was when it was applied (parameter
// servers), for the step's stats.
//   uint64_t last_staleness() const
template <class G>
concept staleness_reporting_agent = requires(const G& g) {
  { g.last_staleness() } -> std::convertible_to<std::uint64_t>;
};

// Steps only a slice of each tensor on this rank and keeps the optimizer state for that
// slice alone (ZeRO-1: aggregation::sharded). Asked once after setup: owned(i) is the range
// of tensor i's elements this rank updates (count 0: none); the replica then creates each
// state for that many elements, and apply(i, grad, scale) hands it a gradient of that length
// for those elements.
//   element_range owned(size_t i) const
template <class G>
concept sharding_agent = requires(const G& cg, std::size_t i) {
  { cg.owned(i) } -> std::convertible_to<element_range>;
};

// Takes the parameters' shapes, in the tensors' order, before setup (strategy<> hands them
// over): a low-rank codec then reads each matrix-shaped tensor as a matrix of its own.
//   void use_shapes(span<const shape>)
template <class G>
concept shape_aware_agent = requires(G& g, std::span<const shape> shapes) { g.use_shapes(shapes); };

// Reports whether the latest step closed without this replica's gradients (K of N: the
// all-reduce's backup workers), for the step's stats.
//   bool last_step_dropped() const
template <class G>
concept dropping_agent = requires(const G& g) {
  { g.last_step_dropped() } -> std::convertible_to<bool>;
};

// Communicates on the communicator's thread across step boundaries (K of N's run-ahead):
// then the caller's thread must not read the transport between steps, and a step's bytes
// are not measured.
//   bool communicates_between_steps() const
template <class G>
concept background_communicating_agent = requires(const G& g) {
  { g.communicates_between_steps() } -> std::convertible_to<bool>;
};

// Numbers the steps whose updates it applies (from 0 at setup), so that a learning-rate
// schedule (strategy::schedule_lr) reads each update's own step: a K-of-N replica that was
// late applies several steps in one finish.
//   uint64_t applying_step() const
template <class G>
concept step_counting_agent = requires(const G& g) {
  { g.applying_step() } -> std::convertible_to<std::uint64_t>;
};

// Compressor: how a buffer of V travels in fewer bytes (gradwire/compress/ holds the library's
// codecs: fp16, bf16, int8, top_k, powersgd, and error_feedback<Codec> around the first four).
// The codec is settings, the same on every rank; what changes from step to step lives in a
// state per buffer (per bucket) that the caller keeps: error feedback's residual, PowerSGD's Q.
//   static compression_kind kind                  how a reduction over ranks composes with it (below)
//   template <class V> struct state               per-buffer state; init allocates all of it
//   state<V> init<V>(size_t n) const              fresh state for a buffer of n elements
//   size_t encoded_bytes<V>(size_t n) const       the payload of n elements: a function of n alone,
//                                                 so every rank knows every payload's size
//   void encode(state<V>&, span<const V> in, span<byte> out) const
//                                                 this rank's own buffer, through its state (error
//                                                 feedback adds the residual first, then keeps the new one)
//   void decode(span<const byte> in, span<V> out) const        out = decode(in), from the payload
//                                                 alone: any rank's payload decodes to the same bits
//   void decode_add(span<const byte> in, span<V> inout) const  inout += decode(in)
// Payloads are unaligned bytes (codecs read and write them with memcpy); a size that does not
// match, or an input a codec cannot encode, is errc::invalid_argument.
// How each kind is reduced over ranks (collective/compressed_all_reduce.hpp; model averaging
// reduces its pseudo-gradients, params at the last average minus params now, through the
// same call; a parameter-server push is encode on the worker and decode_add on the server,
// whatever the kind):
//   linear    decode(encode(a)) + decode(encode(b)), re-encoded, is a fair encoding of a + b
//             (fp16, bf16, int8 with a scale): a ring reduce-scatter decodes each hop's chunk,
//             adds it in V and re-encodes it with the codec's map alone, as it has no owner:
//               void encode(span<const V> in, span<byte> out) const
//             then the owner of each chunk takes decode(encode(sum)) and the ring all-gathers
//             the encoded sums, so every rank holds the same bits.
//   gathered  not linear (the sum of two top-k's is not a top-k): every rank's payload is
//             all-gathered and decode_add-ed in rank order, the same order on every rank.
//   low_rank  reduced as factors through two all-reduces (PowerSGD: all-reduce P,
//             orthogonalise, Q = M^T P, all-reduce Q), which the codec splits into three calls:
//               span<V> low_rank_begin(state<V>&, span<const V> in)  the first factor to sum
//                           over ranks (P = M Q; before the codec's start step, all of M: plain)
//               span<V> low_rank_middle(state<V>&)   once the first is summed: the second factor
//                           to sum (orthogonalise P, Q = M^T P), empty when the step is plain
//               void low_rank_end(state<V>&, span<V> out)   once both are summed: out = the
//                           approximation of the sum over ranks (P Q^T)
//             Every rank calls the three in the same steps, so their states agree on the step.
enum class compression_kind { linear, gathered, low_rank };

template <class C, class V>
concept compressor =
    std::copy_constructible<C> &&
    requires(const C& c, typename C::template state<V>& s, std::span<const V> in, std::span<V> out,
             std::span<const std::byte> payload, std::span<std::byte> into, std::size_t n) {
      { C::kind } -> std::convertible_to<compression_kind>;
      { c.template init<V>(n) } -> std::same_as<typename C::template state<V>>;
      { c.template encoded_bytes<V>(n) } -> std::convertible_to<std::size_t>;
      c.encode(s, in, into);
      c.decode(payload, out);
      c.decode_add(payload, out);
    } &&
    (C::kind != compression_kind::linear ||
     requires(const C& c, std::span<const V> in, std::span<std::byte> into) { c.encode(in, into); }) &&
    (C::kind != compression_kind::low_rank ||
     requires(const C& c, typename C::template state<V>& s, std::span<const V> in, std::span<V> out) {
       { c.low_rank_begin(s, in) } -> std::same_as<std::span<V>>;
       { c.low_rank_middle(s) } -> std::same_as<std::span<V>>;
       c.low_rank_end(s, out);
     });

// A compressor that plans a buffer from the shapes of the tensors packed in it, in order
// (PowerSGD: a matrix per tensor of two or more axes, the rest sent plain). Its state from
// this init serves the all-reduce's rounds; a single encode needs init<V>(n).
//   state<V> init<V>(span<const shape> tensors) const    elements: the sum of theirs
template <class C, class V>
concept shape_aware_compressor = compressor<C, V> && requires(const C& c, std::span<const shape> tensors) {
  { c.template init<V>(tensors) } -> std::same_as<typename C::template state<V>>;
};

// Replica: where strategy<> keeps this replica's parameter tensors and optimizer state, and
// the host view of the parameters (a span per tensor) that every aggregation reads and
// writes. The tensor's location picks it (training/replica.hpp): training::host_replica,
// whose view is the tensors themselves, or for CUDA tensors the device replica
// (cuda/device_replica.cuh): pinned host mirrors, the optimizer on the device.
//   typename state_type                 the optimizer's per-tensor state (what a checkpoint saves)
//   static const char* where            for the setup log: "" or ", on the CUDA device"
//   setup(agent, comm, span<Tensor>, Optimizer&)    collective, once: the states, the view,
//                                       then agent.setup(comm, parameters()) over the view
//   span<const span<V>> parameters() const          the host view
//   span<state_type> states(), span<const state_type> states() const    one per tensor
//   on_host(f)                          returns f(), run on an up-to-date view; the tensors
//                                       then get what f wrote (a parameter server's serve)
template <class R, class Tensor, class Optimizer, class Transport>
concept replica =
    std::move_constructible<R> &&
    requires(R& r, const R& cr, detail::setup_archetype& agent, collective::communicator<Transport>& comm,
             std::span<Tensor> tensors, Optimizer& optimizer, detail::host_work_archetype work) {
      typename R::state_type;
      { R::where } -> std::convertible_to<const char*>;
      r.setup(agent, comm, tensors, optimizer);
      { cr.parameters() } -> std::same_as<std::span<const std::span<typename Tensor::value_type>>>;
      { r.states() } -> std::same_as<std::span<typename R::state_type>>;
      { cr.states() } -> std::same_as<std::span<const typename R::state_type>>;
      r.on_host(work);
    };

// A replica whose optimizer runs on its host view, a tensor at a time, as the aggregation
// applies each update: strategy<> gives it the incremental step (begin_step, ready,
// finish), no_sync micro-batches and the finite check. Any other replica (the device one)
// takes the one-call step only, through its own step(agent, comm, grads, local_only,
// optimizer, meter).
//   apply(Optimizer&, size_t i, span<const V> grad, V grad_scale)    Optimizer::step on tensor i
template <class R, class Tensor, class Optimizer, class Transport>
concept incremental_replica =
    replica<R, Tensor, Optimizer, Transport> &&
    requires(R& r, Optimizer& optimizer, std::size_t i, std::span<const typename Tensor::value_type> grad,
             typename Tensor::value_type grad_scale) { r.apply(optimizer, i, grad, grad_scale); };

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
