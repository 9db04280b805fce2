// The incremental step's state machine: a step opens, each tensor is marked once, it finishes or is given up; pending_step is its handle.
//
// begin_step() opens a session; step.ready(i, grad) / step.unused(i) mark tensor i (from
// any thread: marks are serialised by the session's mutex, which the strategy holds
// while it hands the gradient on); finish() refuses later marks and checks that every
// tensor was marked. A step given up after some of its gradients went to the aggregation
// leaves this rank out of step with the others (their collectives may no longer pair up),
// and every later begin_step() refuses with errc::mismatch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../tensor/shape.hpp"

namespace gradwire::training {

namespace detail {
// A mutex member that lets its owner stay movable (a moved-to object gets a fresh one;
// nothing may hold it during a move).
struct movable_mutex {
  std::mutex mutex;
  movable_mutex() = default;
  movable_mutex(movable_mutex&&) noexcept {}
  movable_mutex& operator=(movable_mutex&&) noexcept { return *this; }
};
}  // namespace detail

// How a tensor stands in the step in progress.
enum class mark : std::uint8_t { none, ready, unused };

// A gradient as a step takes it (concepts::gradient), as a span (over device memory for a
// device tensor: only its size is read there).
template <class V, class Gradient>
std::span<const V> gradient_span(const Gradient& g) {
  if constexpr (concepts::tensor<std::remove_const_t<Gradient>>)
    return {g.data(), g.size()};
  else
    return std::span<const V>(g);
}

// One replica's incremental steps, one at a time, over its parameter tensors (a template
// on their type: a TU that includes this header and steps nothing compiles none of it).
template <class Tensor>
class step_session {
 public:
  explicit step_session(std::size_t tensors = 0) : marks_(tensors, mark::none) {}

  // step(grads): one gradient per parameter tensor, each of its parameter's size.
  template <class Gradient>
  static void check_gradients(std::span<Gradient> gradients, std::span<const Tensor> parameters) {
    if (gradients.size() != parameters.size())
      throw error(errc::invalid_argument, "strategy::step: got " + std::to_string(gradients.size()) +
                                              " gradient tensors for " + std::to_string(parameters.size()) +
                                              " parameter tensors");
    for (std::size_t i = 0; i < gradients.size(); ++i)
      check_size("strategy::step: gradient ", i, gradient_span<typename Tensor::value_type>(gradients[i]).size(),
                 parameters[i].size());
  }
  // Gradient i must have its parameter's `expected` elements (`who` starts the message).
  static void check_size(const char* who, std::size_t i, std::size_t n, std::size_t expected) {
    if (n != expected)
      throw error(errc::invalid_argument, who + std::to_string(i) + " has " + std::to_string(n) +
                                              " elements but parameter " + std::to_string(i) + " has " +
                                              std::to_string(expected));
  }

  bool local_only() const noexcept { return no_sync_; }  // a no_sync micro-batch
  std::mutex& mutex() noexcept { return mutex_.mutex; }  // held by whoever marks a tensor

  // begin_step's refusals: a step already open (a local misuse), this rank out of step
  // with the others (a mismatch between ranks).
  void refuse_overlap(int rank) const {
    if (open_)
      throw error(errc::invalid_argument, "strategy::begin_step: a step is already in progress on rank " +
                                              std::to_string(rank) + " (finish() it, or drop its handle, first)");
  }
  void refuse_out_of_step() const {
    if (!out_of_step_.empty()) throw error(errc::mismatch, out_of_step_);
  }
  void open(bool local_only) noexcept {
    open_ = true;
    finishing_ = false;
    no_sync_ = local_only;
    std::fill(marks_.begin(), marks_.end(), mark::none);
    marked_ = 0;
  }

  // step.ready(i) / step.unused(i): i must name a tensor.
  void check_index(std::size_t i, mark how) const {
    if (i >= marks_.size())
      throw error(errc::invalid_argument, "strategy: step." + std::string(how == mark::unused ? "unused" : "ready") +
                                              "(" + std::to_string(i) + "): the model has " +
                                              std::to_string(marks_.size()) + " parameter tensors");
  }
  // Marks tensor i (of shape `of`); the caller holds mutex(). Refused once finish() was
  // called, and for a tensor marked already.
  void mark_tensor(std::size_t i, mark how, const shape& of) {
    if (finishing_)
      throw error(errc::invalid_argument, "strategy: step." + std::string(how == mark::unused ? "unused" : "ready") +
                                              "(" + std::to_string(i) + ") after finish() was called for this step");
    if (marks_[i] != mark::none)
      throw error(errc::invalid_argument,
                  "strategy: " + describe(i, of) + " was marked " +
                      (marks_[i] == mark::unused ? "unused" : "ready") +
                      " twice in this step (each tensor is marked once per step, by step.ready or step.unused)");
    marks_[i] = how;
    ++marked_;
  }

  // step.finish(): later marks are refused from here on. Nothing when every tensor was
  // marked; else why the step is refused (the tensors missing, by index and shape), and a
  // step whose gradients went out in part leaves this rank out of step.
  std::optional<std::string> finish(std::span<const Tensor> parameters, int rank, int size) {
    {
      std::lock_guard lock(mutex_.mutex);  // a late ready() from another thread is refused from here on
      finishing_ = true;
    }
    if (marked_ == marks_.size()) return std::nullopt;
    std::string missing;
    std::size_t count = 0;
    for (std::size_t i = 0; i < marks_.size(); ++i)
      if (marks_[i] == mark::none && count++ < 4)
        missing += (missing.empty() ? "" : ", ") + describe(i, parameters[i].shape());
    if (count > 4) missing += " and " + std::to_string(count - 4) + " more";
    give_up("a step finished with gradients missing", rank, size);
    return "strategy: step.finish() on rank " + std::to_string(rank) + ": " + missing +
           " never marked ready in this step; call step.ready(i, grad) once backward has produced it, or "
           "step.unused(i) for a parameter this step does not use (it then counts as a zero gradient)";
  }

  // A step ends: finished, failed, or its handle dropped before finish().
  void close() noexcept { open_ = false; }
  // A step given up: once some of its gradients went to the aggregation (not in a
  // micro-batch, which communicates nothing), this rank is out of step.
  void give_up(const char* what, int rank, int size) noexcept {
    if (!no_sync_ && marked_ > 0) fall_out_of_step(what, rank, size);
  }
  // After a step given up midway, this rank's collectives may no longer pair up with the
  // others' (the same ones, in the same order): refuse further steps rather than mix up
  // gradients silently. One rank alone cannot fall out of step.
  void fall_out_of_step(const char* what, int rank, int size) noexcept {
    if (size == 1 || !out_of_step_.empty()) return;
    try {
      out_of_step_ = "strategy: rank " + std::to_string(rank) + " cannot step with the other ranks any more: " + what +
                     ", so its communication may no longer line up with theirs; restart the job (from a checkpoint)";
    } catch (...) {
      out_of_step_ = "strategy: this rank is out of step with the others; restart the job";
    }
  }

 private:
  static std::string describe(std::size_t i, const shape& of) {
    return "gradient " + std::to_string(i) + " (parameter of shape " + of.to_string() + ")";
  }

  detail::movable_mutex mutex_;  // ready() may come from several threads
  std::vector<mark> marks_;
  std::size_t marked_ = 0;
  bool open_ = false, no_sync_ = false;
  bool finishing_ = false;   // finish() has begun: ready() is refused
  std::string out_of_step_;  // why this rank can take no more steps (empty: it can)
};

// The handle of a step in progress (strategy::begin_step()). Move-only; dropping it before
// finish() gives the step up. Owner (the strategy) provides mark_ready, finish_open_step
// and abandon_step, and makes this class its friend.
template <class Owner, class V>
class pending_step {
 public:
  pending_step(pending_step&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
  pending_step& operator=(pending_step&&) = delete;
  ~pending_step() {
    if (owner_) owner_->abandon_step();
  }

  // Gradient i is final for this step (a tensor, or anything std::span<const value_type>
  // can view); it must stay valid and unchanged until finish() returns.
  template <concepts::gradient<V> Gradient>
  pending_step& ready(std::size_t i, const Gradient& gradient) {
    owner("ready")->mark_ready(i, gradient_span<V>(gradient), mark::ready);
    return *this;
  }
  // Tensor i gets no gradient from this replica this step: it counts as zeros.
  pending_step& unused(std::size_t i) {
    owner("unused")->mark_ready(i, {}, mark::unused);
    return *this;
  }
  // Waits for the communication, applies the update, ends the step.
  void finish() {
    Owner* s = owner("finish");
    owner_ = nullptr;
    s->finish_open_step();
  }

 private:
  friend Owner;
  explicit pending_step(Owner* owner) noexcept : owner_(owner) {}
  Owner* owner(const char* what) const {
    if (!owner_)
      throw error(errc::invalid_argument,
                  std::string("strategy: step.") + what + "() on a step that has finished (call begin_step() again)");
    return owner_;
  }
  Owner* owner_;
};

}  // namespace gradwire::training
