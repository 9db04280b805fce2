// A parameter server's shard: its pieces of the parameters, their optimizer state, the update and the checksum.
//
// A shard is the list of pieces a server holds (sharding.hpp), in the order its messages
// and its window carry them: a push's gradient and a reply's parameters are the pieces'
// elements one after another. gather and scatter move between that order and the full
// tensors; the worker uses them for the same pieces.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../support/crc32c.hpp"
#include "sharding.hpp"

namespace gradwire::ps::detail {

// The pieces of the full tensors `from`, in shard order, to `out`; returns the end.
template <class V>
V* gather(std::span<const piece> pieces, std::span<const std::span<const V>> from, V* out) {
  for (const auto& p : pieces) out = std::copy_n(from[p.tensor].data() + p.begin, p.size(), out);
  return out;
}

// The inverse: a shard's elements at `in`, in shard order, into the full tensors `to`.
template <class V>
const V* scatter(std::span<const piece> pieces, const V* in, std::span<const std::span<V>> to) {
  for (const auto& p : pieces) {
    std::copy_n(in, p.size(), to[p.tensor].data() + p.begin);
    in += p.size();
  }
  return in;
}

// The same order over one-sided access: f(piece, byte offset) for each piece that has
// elements, the shard laid out in a window zone from byte `at`.
template <class V, class F>
void for_each_piece_at(std::span<const piece> pieces, std::size_t at, F&& f) {
  for (const auto& p : pieces) {
    if (p.size() > 0) f(p, at);
    at += p.size() * sizeof(V);
  }
}

// A server's shard: views of its pieces of the rank's parameter tensors (so the tensors
// hold the final values when the server is done), each with its optimizer state. A
// checkpoint sees it as a model (concepts::checkpoint_model).
template <class V, class Optimizer>
class shard {
 public:
  using value_type = V;
  using optimizer_type = Optimizer;
  using state_type = typename Optimizer::template state<V>;

  shard(std::span<const std::span<V>> params, std::span<const piece> pieces, const Optimizer& optimizer)
      : pieces_(pieces), optimizer_(optimizer) {
    for (const auto& p : pieces_) {
      tensors_.emplace_back(params[p.tensor].data() + p.begin, p.size());
      states_.push_back(optimizer.template init<V>(p.size()));
      elements_ += p.size();
    }
  }

  std::span<const piece> pieces() const noexcept { return pieces_; }
  std::size_t elements() const noexcept { return elements_; }

  std::span<const std::span<V>> parameters() const noexcept { return tensors_; }
  std::span<const state_type> optimizer_states() const noexcept { return states_; }
  std::span<state_type> optimizer_states() noexcept { return states_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }

  // The shard's copy of the optimizer follows options::learning_rate where it can.
  void set_lr(double lr)
    requires concepts::schedulable_optimizer<Optimizer>
  {
    optimizer_.set_lr(lr);
  }

  // Runs the optimizer over the shard with `gradient` (the shard's elements, in order) * scale.
  void apply(std::span<const V> gradient, V scale) {
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      optimizer_.step(states_[k], tensors_[k], gradient.first(pieces_[k].size()), scale);
      gradient = gradient.subspan(pieces_[k].size());
    }
  }

  // The parameters, in shard order, to `out` (a reply); returns the end.
  V* copy_to(V* out) const {
    for (const auto& tensor : tensors_) out = std::copy(tensor.begin(), tensor.end(), out);
    return out;
  }

  // What a server and its standby compare before replication starts (replica_hello):
  // CRC-32C of the parameters' bytes in shard order, in the hello's 64-bit field. It was
  // FNV-1a before issue 36; both sides of a hello are the same build, so no rank compares
  // the two.
  std::uint64_t checksum() const noexcept {
    std::uint32_t crc = 0;
    for (const auto& tensor : tensors_) crc = support::crc32c(std::as_bytes(std::span<const V>(tensor)), crc);
    return crc;
  }

 private:
  std::span<const piece> pieces_;
  std::size_t elements_ = 0;
  Optimizer optimizer_;  // the server's copy: its lr follows options::learning_rate
  std::vector<std::span<V>> tensors_;
  std::vector<state_type> states_;
};

}  // namespace gradwire::ps::detail
