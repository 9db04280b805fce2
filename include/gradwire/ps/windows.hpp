// One-sided windows of a parameter server: their types per transport, and a server's exposed memory.
//
// Over a transport with one-sided access (concepts::one_sided_transport) a server exposes
// one window: per worker a reply block ([reply header][shard parameters]) that the worker
// gets the parameters from, and a landing zone its gradient is put into (the layout is
// protocol.hpp's window_layout). At setup the server sends each worker the window's key,
// or an empty one when no worker's transport prefers one-sided access to it (so no memory
// is registered for nothing); the worker attaches it (worker.hpp). Over any other
// transport there is no window and the types below are empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "../timeouts.hpp"
#include "protocol.hpp"

namespace gradwire::ps {

namespace detail {
template <class Tr>
struct window_types {
  using memory = std::monostate;
  using remote = std::monostate;
};
template <concepts::one_sided_transport Tr>
struct window_types<Tr> {
  using memory = typename Tr::memory_window;
  using remote = typename Tr::remote_window;
};
}  // namespace detail

// Tr::memory_window and Tr::remote_window where Tr has one-sided access; std::monostate otherwise.
template <class Tr>
using memory_window_t = typename detail::window_types<Tr>::memory;
template <class Tr>
using remote_window_t = typename detail::window_types<Tr>::remote;

// The window of one server: the memory (held as V: every block is 64-byte aligned and
// the reply header is a whole number of V, so every block and the parameters in it are
// typed spans) and its registration with the transport, if it was exposed.
template <class V, class Tr>
class server_window {
 public:
  server_window() = default;

  bool exposed() const noexcept { return registration_.has_value(); }

  // Worker w's reply block, [reply header][parameters], and its gradient landing zone: in V
  // (empty when it holds a codec's payload instead), and as the payload's bytes.
  std::span<V> reply(int w) noexcept {
    return {memory_.data() + zones_.reply(w) / sizeof(V), detail::reply_header_elements<V> + elements_};
  }
  std::span<const V> gradient(int w) const noexcept {
    return {memory_.data() + zones_.gradient(w) / sizeof(V), zones_.gradient_bytes == elements_ * sizeof(V) ? elements_ : 0};
  }
  std::span<const std::byte> payload(int w) const noexcept {
    return std::as_bytes(std::span<const V>(memory_.span())).subspan(zones_.gradient(w), zones_.gradient_bytes);
  }

  // A server's half of the setup handshake, collective with worker::attach_windows():
  // exposes the window when some worker's transport prefers one-sided access to this
  // server, and sends every worker its key (empty: no window). `gradient_bytes`: a push's
  // payload through a codec (push_codec.hpp); without one, the elements in V.
  static server_window expose(collective::communicator<Tr>& comm, std::size_t elements, int workers, deadline until)
    requires concepts::one_sided_transport<Tr>
  {
    return expose(comm, elements, workers, until, elements * sizeof(V));
  }
  static server_window expose(collective::communicator<Tr>& comm, std::size_t elements, int workers, deadline until,
                              std::size_t gradient_bytes)
    requires concepts::one_sided_transport<Tr>
  {
    auto& t = comm.transport();
    server_window w;
    bool wanted = false;
    for (int r = 0; r < workers; ++r) wanted = wanted || t.prefers_one_sided(r);
    std::span<const std::byte> key;
    if (wanted) {
      w.zones_ = detail::window_layout::of<V>(elements, gradient_bytes);
      w.elements_ = elements;
      w.memory_ = aligned_buffer<V>(w.zones_.size(workers) / sizeof(V));
      w.registration_.emplace(t.expose(std::as_writable_bytes(w.memory_.span())));
      key = w.registration_->key();
    }
    const std::uint64_t key_size = key.size();
    std::vector<typename Tr::request> sends;
    for (int r = 0; r < workers; ++r) {
      sends.push_back(t.async_send(r, detail::window_size_tag, detail::bytes_of(key_size)));
      if (!key.empty()) sends.push_back(t.async_send(r, detail::window_key_tag, key));
    }
    for (auto& r : sends) t.wait(r, until);
    return w;
  }

 private:
  detail::window_layout zones_;
  std::size_t elements_ = 0;
  aligned_buffer<V> memory_;
  std::optional<memory_window_t<Tr>> registration_;
};

}  // namespace gradwire::ps
