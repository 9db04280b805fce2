// any_transport: a transport whose type is erased behind one virtual call per operation.
//
// Code compiled apart from the transport uses it: a CUDA translation unit (nvcc cannot
// compile Boost.Asio's headers, and UCX's are best kept out of device code) trains with
// strategy<cuda_tensor<float>, ..., any_transport>, while a host .cpp builds the real
// transport and hands it over:
//
//   // join.cpp (g++)                              // train.cu (nvcc)
//   any_transport join() {                          any_transport join();
//     return cluster::join_tcp();                   strategy<cuda_tensor<float>, optim::adam,
//   }                                                        aggregation::all_reduce, any_transport> s(join(), ...);
//
// It claims the capabilities it is given and no others: basic_any_transport<Caps...> models
// the transport concept, receive-and-add (float, double: fused where the held transport has
// it, else the message lands in a staging buffer, kept for reuse, that wait() adds in) and
// each capability in Caps (caps::failable, multiplexing, loss_tolerant, topology_aware),
// and only a transport that has them all may be held: a missing one is a compile error at
// the conversion, not a throw at run time. any_transport claims failable, multiplexing and
// topology_aware, which every shipped transport has; a parameter server that must survive
// a lost worker names basic_any_transport<..., caps::loss_tolerant>. It does not forward
// one-sided access (a parameter server uses tagged messages) and never shares an address
// space (device collectives stage through pinned host memory). Costs: one allocation per
// request and a virtual call (benchmarks/README.md has the figures).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host.hpp"
#include "../observe/type_name.hpp"
#include "../timeouts.hpp"
#include "traffic.hpp"

namespace gradwire::transport {

// The capabilities a basic_any_transport may claim, each the concept it then models.
namespace caps {
struct failable {};        // fail(cause, reason): concepts::failable_transport
struct multiplexing {};    // wait_any: concepts::multiplexing_transport
struct loss_tolerant {};   // tolerate_loss, lost_peers: concepts::loss_tolerant_transport
struct topology_aware {};  // topology(): concepts::topology_aware_transport
}  // namespace caps

namespace detail {
// Whether transport T has the capability Cap names.
template <class Cap, class T>
inline constexpr bool has_capability = false;
template <class T>
inline constexpr bool has_capability<caps::failable, T> = concepts::failable_transport<T>;
template <class T>
inline constexpr bool has_capability<caps::multiplexing, T> = concepts::multiplexing_transport<T>;
template <class T>
inline constexpr bool has_capability<caps::loss_tolerant, T> = concepts::loss_tolerant_transport<T>;
template <class T>
inline constexpr bool has_capability<caps::topology_aware, T> = concepts::topology_aware_transport<T>;

// Tells one erased type from another without RTTI: the address of a variable per type.
template <class T>
inline constexpr char erased_type_tag = 0;

// Which spare buffer to lend for `size` bytes: the smallest that is large enough; else the
// largest, to be grown (fresh memory is slow to touch: growing the largest touches the
// fewest new bytes, and buffers are reused across steps). spares.end() if there is none.
template <class Buffers>
typename Buffers::iterator spare_to_lend(Buffers& spares, std::size_t size) {
  const auto fits = [size](const auto& b) { return b.capacity() >= size; };
  auto best = spares.end();
  for (auto it = spares.begin(); it != spares.end(); ++it) {
    const bool better = best == spares.end() || (fits(*it) ? !fits(*best) || it->capacity() < best->capacity()
                                                           : !fits(*best) && it->capacity() > best->capacity());
    if (better) best = it;
  }
  return best;
}
}  // namespace detail

template <class... Caps>
class basic_any_transport {
  template <class Cap>
  static constexpr bool claims = (std::same_as<Cap, Caps> || ...);

  struct held_request_base {
    explicit held_request_base(const void* type) : type(type) {}
    virtual ~held_request_base() = default;
    const void* type;  // the erased transport type that made it (erased_type_tag)
  };

 public:
  // Owns the erased transport's request: destroying it unfinished withdraws the operation.
  class request {
   public:
    request() = default;
    explicit operator bool() const noexcept { return held_ != nullptr; }

   private:
    friend class basic_any_transport;
    explicit request(std::unique_ptr<held_request_base> held) : held_(std::move(held)) {}
    std::unique_ptr<held_request_base> held_;
  };

  // Takes ownership of any transport with every claimed capability (implicitly, like
  // std::function from a callable). Its request type must be default-constructible and
  // move-assignable (a staged receive-and-add starts empty and is filled once its buffer
  // is lent).
  template <class T>
    requires(!std::same_as<std::remove_cvref_t<T>, basic_any_transport> && concepts::transport<std::remove_cvref_t<T>> &&
             std::default_initializable<typename std::remove_cvref_t<T>::request> &&
             std::is_move_assignable_v<typename std::remove_cvref_t<T>::request> &&
             (detail::has_capability<Caps, std::remove_cvref_t<T>> && ...))
  basic_any_transport(T&& transport)  // NOLINT(google-explicit-constructor)
      : self_(std::make_unique<model<std::remove_cvref_t<T>>>(std::forward<T>(transport))) {}

  basic_any_transport(basic_any_transport&&) noexcept = default;
  basic_any_transport& operator=(basic_any_transport&&) noexcept = default;

  int rank() const { return get().rank(); }
  int size() const { return get().size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    traffic_.sent(bytes.size());
    return request(get().async_send(peer, tag, bytes));
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    traffic_.received(bytes.size());
    return request(get().async_recv(peer, tag, bytes));
  }
  // Receives a message of inout.size() elements and adds it into inout.
  template <class V>
    requires(std::same_as<V, float> || std::same_as<V, double>)
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    traffic_.received(inout.size_bytes());
    return request(get().async_recv_accumulate(peer, tag, inout));
  }
  // The request is empty afterwards, whether the wait returns or throws (as the held
  // transport's own requests are), so a second wait is refused rather than repeated.
  void wait(request& r, deadline until) {
    if (!r) throw error(errc::invalid_argument, "any_transport: wait on an empty or already finished request");
    const auto finished = std::move(r.held_);
    get().wait(*finished, until);
  }
  std::size_t wait_any(std::span<request* const> requests, deadline until)
    requires claims<caps::multiplexing>
  {
    return get().wait_any(requests, until);
  }
  void fail(errc cause, const std::string& reason)
    requires claims<caps::failable>
  {
    get().fail(cause, reason);
  }
  void tolerate_loss(int peer)
    requires claims<caps::loss_tolerant>
  {
    get().tolerate_loss(peer);
  }
  std::vector<int> lost_peers() const
    requires claims<caps::loss_tolerant>
  {
    return get().lost_peers();
  }
  // The held transport's time (concepts::timed_transport; the steady clock unless it keeps
  // its own, as a simulated rank's endpoint does).
  time_source time() const { return get().time(); }
  // Whether the held transport can lose a peer and go on now (a per_peer of two, say,
  // answers at run time: concepts::tolerates_loss).
  bool tolerates_loss() const
    requires claims<caps::loss_tolerant>
  {
    return get().tolerates_loss();
  }
  // Payload sent and received through this interface (concepts::metered_transport).
  traffic_counters traffic() const noexcept { return traffic_; }
  const cluster::topology& topology() const
    requires claims<caps::topology_aware>
  {
    return get().topology();
  }

  // The erased transport, when it is a T (nullptr otherwise): for its own settings.
  template <class T>
  T* target() noexcept {
    if (!self_ || self_->type() != &detail::erased_type_tag<T>) return nullptr;
    return &static_cast<model<T>*>(self_.get())->transport;
  }

 private:
  // Every capability has its slot; a model fills those its transport has (the constructor
  // admits only transports with every claimed one, and only claimed ones are callable).
  struct interface {
    virtual ~interface() = default;
    virtual const void* type() const = 0;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::unique_ptr<held_request_base> async_send(int, std::uint64_t, std::span<const std::byte>) = 0;
    virtual std::unique_ptr<held_request_base> async_recv(int, std::uint64_t, std::span<std::byte>) = 0;
    virtual std::unique_ptr<held_request_base> async_recv_accumulate(int, std::uint64_t, std::span<float>) = 0;
    virtual std::unique_ptr<held_request_base> async_recv_accumulate(int, std::uint64_t, std::span<double>) = 0;
    virtual void wait(held_request_base&, deadline) = 0;
    virtual std::size_t wait_any(std::span<request* const>, deadline) = 0;
    virtual void fail(errc, const std::string&) = 0;
    virtual void tolerate_loss(int) = 0;
    virtual std::vector<int> lost_peers() const = 0;
    virtual bool tolerates_loss() const = 0;
    virtual time_source time() const = 0;
    virtual const cluster::topology& topology() const = 0;
  };

  // Staging buffers for receive-and-add, shared with the requests that borrow them, so a
  // request may outlive its transport as the transports' own requests may.
  using spare_buffers = std::vector<std::vector<std::byte>>;

  template <class T>
  struct model final : interface {
    // A request of T; finish() runs once wait() has completed it.
    struct held_base : held_request_base {
      held_base() : held_request_base(&detail::erased_type_tag<T>) {}
      virtual typename T::request& inner() = 0;
      virtual void finish() {}
    };
    struct held final : held_base {
      explicit held(typename T::request r) : request(std::move(r)) {}
      typename T::request& inner() override { return request; }
      typename T::request request;
    };
    // A staging buffer lent by the model: goes back to its spares when the request is done.
    struct lent_buffer {
      lent_buffer(std::shared_ptr<spare_buffers> pool, std::size_t size) : spares(std::move(pool)) {
        if (auto best = detail::spare_to_lend(*spares, size); best != spares->end())
          bytes = std::move(*best), spares->erase(best);
        bytes.resize(size);
      }
      lent_buffer(const lent_buffer&) = delete;
      lent_buffer& operator=(const lent_buffer&) = delete;
      ~lent_buffer() {
        try {
          spares->push_back(std::move(bytes));
        } catch (...) {  // out of memory for the list: the buffer is simply freed
        }
      }
      std::shared_ptr<spare_buffers> spares;
      std::vector<std::byte> bytes;
    };
    // Receive-and-add where T has no fused one: the message lands in a lent buffer and
    // finish() adds it in. The buffer is declared first, so it is given back only after
    // the request (destroyed first) has withdrawn an unfinished receive.
    template <class V>
    struct staged_sum final : held_base {
      staged_sum(model& m, std::span<V> into) : buffer(m.spares, into.size_bytes()), target(into) {}
      typename T::request& inner() override { return request; }
      void finish() override {
        kernels::add(target.data(), reinterpret_cast<const V*>(buffer.bytes.data()), target.size());
      }
      lent_buffer buffer;
      std::span<V> target;
      typename T::request request;
    };

    template <class U>
    explicit model(U&& t) : transport(std::forward<U>(t)) {}

    const void* type() const override { return &detail::erased_type_tag<T>; }
    int rank() const override { return transport.rank(); }
    int size() const override { return transport.size(); }
    std::unique_ptr<held_request_base> async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) override {
      return std::make_unique<held>(transport.async_send(peer, tag, b));
    }
    std::unique_ptr<held_request_base> async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) override {
      return std::make_unique<held>(transport.async_recv(peer, tag, b));
    }
    std::unique_ptr<held_request_base> async_recv_accumulate(int peer, std::uint64_t tag, std::span<float> v) override {
      return accumulate(peer, tag, v);
    }
    std::unique_ptr<held_request_base> async_recv_accumulate(int peer, std::uint64_t tag,
                                                             std::span<double> v) override {
      return accumulate(peer, tag, v);
    }
    template <class V>
    std::unique_ptr<held_request_base> accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
      if constexpr (concepts::accumulating_transport<T, V>) {
        return std::make_unique<held>(transport.async_recv_accumulate(peer, tag, inout));
      } else {
        auto staged = std::make_unique<staged_sum<V>>(*this, inout);
        staged->request = transport.async_recv(peer, tag, std::span<std::byte>(staged->buffer.bytes));
        return staged;
      }
    }
    void wait(held_request_base& r, deadline until) override {
      auto& h = mine(r);
      transport.wait(h.inner(), until);
      h.finish();
    }

    std::size_t wait_any(std::span<request* const> requests, deadline until) override {
      if constexpr (concepts::multiplexing_transport<T>) {
        pointers.clear();  // reused: a server calls this once per message
        for (request* r : requests) pointers.push_back(r && r->held_ ? &mine(*r->held_).inner() : nullptr);
        return transport.wait_any(std::span<typename T::request* const>(pointers), until);
      } else {
        lacks("wait_any (concepts::multiplexing_transport)");
      }
    }
    void fail(errc cause, const std::string& reason) override {
      if constexpr (concepts::failable_transport<T>)
        transport.fail(cause, reason);
      else
        lacks("fail (concepts::failable_transport)");
    }
    void tolerate_loss(int peer) override {
      if constexpr (concepts::loss_tolerant_transport<T>)
        transport.tolerate_loss(peer);
      else
        lacks("tolerate_loss (concepts::loss_tolerant_transport)");
    }
    std::vector<int> lost_peers() const override {
      if constexpr (concepts::loss_tolerant_transport<T>)
        return transport.lost_peers();
      else
        return {};
    }
    bool tolerates_loss() const override { return concepts::tolerates_loss(transport); }
    time_source time() const override { return concepts::time_of(transport); }
    const cluster::topology& topology() const override {
      if constexpr (concepts::topology_aware_transport<T>)
        return transport.topology();
      else
        return one_host;
    }

    // A request another any_transport made around a different transport type is refused,
    // not reinterpreted.
    static held_base& mine(held_request_base& r) {
      if (r.type != &detail::erased_type_tag<T>)
        throw error(errc::invalid_argument, "any_transport: a request made by a different transport type was handed "
                                            "to the one around " + type_name());
      return static_cast<held_base&>(r);
    }
    // Unreachable through the public members (each is constrained on its claim): a slot of
    // the interface that this model's transport cannot fill.
    [[noreturn]] static void lacks(const char* what) {
      throw error(errc::invalid_argument,
                  "any_transport: the transport it holds (" + type_name() + ") has no " + what);
    }
    static std::string type_name() { return observe::type_name<T>(); }

    T transport;
    cluster::topology one_host = cluster::topology::one_host(transport.size());  // for T without a topology
    std::vector<typename T::request*> pointers;
    std::shared_ptr<spare_buffers> spares = std::make_shared<spare_buffers>();
  };

  interface& get() const {
    if (!self_) throw error(errc::invalid_argument, "any_transport: used after it was moved from");
    return *self_;
  }

  std::unique_ptr<interface> self_;
  traffic_counters traffic_;
};

// What every shipped transport has (inproc, asio_tcp, ucx, mpi, per_peer, simulated).
using any_transport = basic_any_transport<caps::failable, caps::multiplexing, caps::topology_aware>;

static_assert(concepts::transport<any_transport> && concepts::failable_transport<any_transport>);
static_assert(concepts::multiplexing_transport<any_transport> && !concepts::loss_tolerant_transport<any_transport>);
static_assert(concepts::metered_transport<any_transport> && concepts::topology_aware_transport<any_transport>);
static_assert(concepts::accumulating_transport<any_transport, float> &&
              concepts::accumulating_transport<any_transport, double>);
// Claims only what it is given.
static_assert(concepts::transport<basic_any_transport<>> && !concepts::failable_transport<basic_any_transport<>> &&
              !concepts::multiplexing_transport<basic_any_transport<>> &&
              !concepts::topology_aware_transport<basic_any_transport<>>);
static_assert(concepts::timed_transport<basic_any_transport<>>);  // the held transport's time
static_assert(concepts::loss_tolerant_transport<basic_any_transport<caps::loss_tolerant>> &&
              concepts::conditionally_loss_tolerant_transport<basic_any_transport<caps::loss_tolerant>>);

}  // namespace gradwire::transport
