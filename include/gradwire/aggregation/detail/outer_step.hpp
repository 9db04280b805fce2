// DiLoCo's outer step for averaging<H, Outer>: the anchor, each fragment's pseudo-gradient and its all-reduce, the outer optimizer.
//
// The maths, the defaults and the schedule are stated in averaging.hpp. Here: the anchor
// (the parameters of the last synchronisation) and the pseudo-gradient buffer are two flat
// buffers in the parameters' index order, cut into F fragments of about equal bytes
// (elements [f*T/F, (f+1)*T/F) of T); a fragment is a list of pieces (a tensor's elements
// inside the fragment), each with its own outer optimizer state, so a fragment may cut a
// tensor: every shipped optimizer is element-wise, so the cut changes nothing. Everything
// is allocated and touched at setup; a step allocates nothing. Each fragment's all-reduce
// works on its own slice of the pseudo-gradient buffer, so several can be in flight on the
// communicator's async engine while the inner steps go on writing the parameters.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../collective/all_reduce.hpp"
#include "../../collective/async_engine.hpp"
#include "../../collective/communicator.hpp"
#include "../../collective/compressed_all_reduce.hpp"
#include "../../concepts.hpp"
#include "../../kernels/host.hpp"
#include "../../error.hpp"
#include "../../tensor/aligned_buffer.hpp"
#include "../../tensor/flat_layout.hpp"
#include "../no_codec.hpp"

namespace gradwire::aggregation::detail {

// When each fragment synchronises. Local steps are counted from 1 at the first step after
// setup; fragment f's all-reduce starts right after local step s when s % H == f*H/F (so
// fragment 0 after steps H, 2H, ..., fragment f first after step f*H/F, which is fewer
// than H inner steps, then every H), and its outer update lands right after step s + delay.
// Every rank counts the same steps, so every rank starts the same all-reduces in the same
// order (fragment order within a step): the async engine's sequence numbers line up.
struct fragment_schedule {
  std::uint64_t period = 1, fragments = 1, delay = 0;

  std::uint64_t offset(std::size_t f) const noexcept { return static_cast<std::uint64_t>(f) * period / fragments; }
  bool starts(std::size_t f, std::uint64_t step) const noexcept { return step > 0 && step % period == offset(f); }
};

// Outer: concepts::optimizer<Outer, V> (checked by the agent). Codec: no_codec, or a
// concepts::compressor<Codec, V> the pseudo-gradients travel through (bf16, int8, ...:
// collective::compressed_all_reduce, a codec state per call of each fragment).
template <class V, class Outer, class Codec = no_codec>
class outer_step {
  static constexpr bool compressed = !std::is_same_v<Codec, no_codec>;
  struct none {};
  using buffer_type = std::conditional_t<compressed, collective::compressed_buffer<Codec, V>, none>;

 public:
  // chunk_elements: the most elements one all-reduce call takes (the bucket budget).
  outer_step(const Outer& outer, fragment_schedule schedule, std::size_t chunk_elements, Codec codec = Codec())
      : outer_(outer), schedule_(schedule), chunk_(std::max<std::size_t>(chunk_elements, 1)) {
    if constexpr (compressed) codec_ = std::make_unique<Codec>(std::move(codec));
  }

  const fragment_schedule& schedule() const noexcept { return schedule_; }
  std::span<const V> anchor() const noexcept { return anchor_.span(); }

  // After the broadcast: every replica holds the same parameters, the first anchor. `ranks`:
  // the job's size (a compressed pseudo-gradient's buffers are made for it).
  void setup(std::span<const std::span<V>> params, int ranks) {
    layout_ = flat_layout::of(params);
    const std::size_t total = layout_.total(), fragments = schedule_.fragments;
    if (fragments > std::max<std::size_t>(total, 1))
      throw error(errc::invalid_argument,
                  "aggregation::averaging: stream(" + std::to_string(fragments) + " fragments): the model has only " +
                      std::to_string(total) + " parameter elements; use at most that many fragments");
    // Allocated and touched now (aligned_buffer zeroes what it allocates; first touch of
    // fresh memory is slow here), never in a step.
    anchor_ = aligned_buffer<V>(total);
    delta_ = aligned_buffer<V>(total);
    layout_.gather(params, anchor_.span());
    pieces_.clear();
    first_piece_.assign(fragments + 1, 0);
    for (std::size_t f = 0; f < fragments; ++f) {
      first_piece_[f] = pieces_.size();
      const std::size_t lo = f * total / fragments, hi = (f + 1) * total / fragments;
      for (std::size_t i = 0; i < layout_.tensor_count(); ++i) {
        const std::size_t begin = std::max(lo, layout_.offset(i)), end = std::min(hi, layout_.offset(i) + layout_.size(i));
        if (begin < end) pieces_.push_back({i, begin - layout_.offset(i), begin, end - begin});
      }
    }
    first_piece_[fragments] = pieces_.size();
    states_.clear();
    states_.reserve(pieces_.size());
    for (const piece& p : pieces_) states_.push_back(outer_.template init<V>(p.count));
    if constexpr (compressed) {
      // Every call's codec state and encoded bytes, one per chunk of each fragment, made now.
      buffers_.assign(fragments, {});
      for (std::size_t f = 0; f < fragments; ++f) {
        const std::size_t n = (f + 1) * total / fragments - f * total / fragments;
        for (std::size_t at = 0; at < n; at += chunk_)
          buffers_[f].emplace_back(*codec_, std::min(chunk_, n - at), ranks);
      }
    } else {
      (void)ranks;
    }
    flight_.assign(fragments, {});
    handles_.clear();
    handles_.resize(fragments);
  }

  // Right after local step `step` (every rank calls it after every step): starts the
  // fragments due now, then lands those whose delay is over (with delay 0, the ones just
  // started).
  template <class Tr>
  void after_step(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, std::uint64_t step) {
    for (std::size_t f = 0; f < flight_.size(); ++f)
      if (schedule_.starts(f, step)) start(comm, params, f, step);
    for (std::size_t f = 0; f < flight_.size(); ++f)
      if (flight_[f].started && flight_[f].lands == step) land(comm, params, f);
  }

  // Waits for every all-reduce running in the background (their updates still land at
  // their steps): afterwards the caller's thread may use the communicator.
  template <class Tr>
  void wait_in_flight(collective::communicator<Tr>& comm) {
    for (auto& h : handles_)
      if (h.valid()) h.wait(comm.queued_collective_deadline());
  }
  // Whether an all-reduce may be running on the async engine now.
  bool in_flight() const noexcept {
    return std::any_of(handles_.begin(), handles_.end(), [](const collective::async_handle& h) { return h.valid(); });
  }
  // Fragments whose all-reduce has started and whose outer update has not landed yet.
  std::size_t pending() const noexcept {
    return static_cast<std::size_t>(std::count_if(flight_.begin(), flight_.end(), [](const flight& x) { return x.started; }));
  }

  // Lands every update still owed now (each waits for its all-reduce first), in fragment
  // order, as if its delay had ended with the latest step: nothing is pending afterwards.
  template <class Tr>
  void flush(collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (std::size_t f = 0; f < flight_.size(); ++f)
      if (flight_[f].started) land(comm, params, f);
  }

  // What a checkpoint carries (averaging_agent's checkpoint hooks), so that a restored job
  // goes on bit for bit. Buffers: the anchor, the pseudo-gradients (a pending fragment's
  // slice holds its mean, which its update lands with), each piece's outer state, each
  // all-reduce call's codec state. Counters: each fragment's flight (started, the step it
  // lands after), then the outer and codec states' counters. Refused while an all-reduce
  // runs: its slice of the pseudo-gradients is not final until it is waited for.
  template <class F>
  void for_each_buffer(F&& f) {
    visit_buffers(*this, f);
  }
  template <class F>
  void for_each_buffer(F&& f) const {
    visit_buffers(*this, f);
  }
  template <class F>
  void for_each_counter(F&& f) {
    visit_counters(*this, f);
  }
  template <class F>
  void for_each_counter(F&& f) const {
    visit_counters(*this, f);
  }

 private:
  struct piece {
    std::size_t tensor, begin;  // elements [begin, begin + count) of tensor `tensor`
    std::size_t flat, count;    // at [flat, flat + count) of the anchor and the pseudo-gradient
  };
  struct flight {
    bool started = false;
    std::uint64_t lands = 0;  // the step after which its update is applied
  };

  std::span<V> fragment(aligned_buffer<V>& buffer, std::size_t f) noexcept {
    const std::size_t total = layout_.total(), fragments = schedule_.fragments;
    const std::size_t lo = f * total / fragments, hi = (f + 1) * total / fragments;
    return buffer.span().subspan(lo, hi - lo);
  }

  // What one fragment's all-reduce works on: heap memory only (the pseudo-gradients, the
  // codec's buffers and the codec itself), so that it survives the agent being moved while
  // it runs on the async engine.
  struct reduction {
    std::span<V> data;
    std::size_t chunk;
    buffer_type* buffers;  // with a codec: one per call
    const Codec* codec;
  };
  reduction reduction_of(std::size_t f) noexcept {
    if constexpr (compressed)
      return {fragment(delta_, f), chunk_, buffers_[f].data(), codec_.get()};
    else
      return {fragment(delta_, f), chunk_, nullptr, nullptr};
  }

  // The all-reduce (average) of a fragment's pseudo-gradient, at most chunk elements a
  // call: as V, or through the codec (a sum every rank decodes to the same bits, then / N).
  template <class Tr>
  static void reduce(collective::communicator<Tr>& comm, reduction r) {
    auto trace = comm.trace("outer fragment", r.data.size_bytes(), "bucket");
    for (std::size_t at = 0, call = 0; at < r.data.size(); at += r.chunk, ++call) {
      const std::span<V> part = r.data.subspan(at, std::min(r.chunk, r.data.size() - at));
      if constexpr (compressed) {
        collective::compressed_all_reduce(comm, *r.codec, r.buffers[call], part);
        kernels::scale(part.data(), V(1) / static_cast<V>(comm.size()), part.size());
      } else {
        collective::all_reduce(comm, part, collective::reduce_op::average);
      }
    }
  }

  template <class Self, class F>
  static void visit_buffers(Self& self, F& f) {
    refuse_while_in_flight(self);
    f(self.anchor_.span());
    f(self.delta_.span());
    for (auto& s : self.states_) s.for_each_buffer(f);
    if constexpr (compressed && codec_state_shown())  // else refuse_while_in_flight's static_assert says why
      for (auto& calls : self.buffers_)
        for (auto& b : calls) b.state().for_each_buffer(f);
  }
  // Counters are u64 in a checkpoint; each is copied out and, when loading, back.
  template <class Self, class F>
  static void visit_counters(Self& self, F& f) {
    refuse_while_in_flight(self);
    constexpr bool loading = !std::is_const_v<Self>;
    auto as_u64 = [&f](auto& c) {
      std::uint64_t v = static_cast<std::uint64_t>(c);
      f(v);
      if constexpr (loading) c = static_cast<std::remove_cvref_t<decltype(c)>>(v);
    };
    for (auto& x : self.flight_) {
      std::uint64_t started = x.started ? 1 : 0;
      f(started);
      if constexpr (loading) x.started = started != 0;
      f(x.lands);
    }
    for (auto& s : self.states_) s.for_each_counter(as_u64);
    if constexpr (compressed && codec_state_shown())
      for (auto& calls : self.buffers_)
        for (auto& b : calls) b.state().for_each_counter(as_u64);
  }
  static constexpr bool codec_state_shown() {
    if constexpr (compressed)
      return concepts::buffer_visiting_state<typename buffer_type::state_type> &&
             concepts::counter_visiting_state<typename buffer_type::state_type>;
    else
      return true;
  }
  static void refuse_while_in_flight(const outer_step& self) {
    static_assert(codec_state_shown(),
                  "gradwire checkpoints of averaging<H, Outer, Codec> (DiLoCo with compressed pseudo-gradients): the "
                  "codec's state keeps something between steps (error feedback's residual, PowerSGD's factors, "
                  "top-k's order) and shows it to no checkpoint (for_each_buffer / for_each_counter); use fp16, bf16 "
                  "or int8, whose state keeps nothing, or no codec");
    if (self.in_flight())
      throw error(errc::invalid_argument,
                  "checkpoint of averaging with an outer optimizer (DiLoCo): a fragment's all-reduce is still running "
                  "in the background (streaming with a delay); save_checkpoint on a non-const strategy waits for it, "
                  "or call strategy.aggregation().wait_in_flight(strategy.communicator()) before saving");
  }

  // This replica's pseudo-gradient theta - theta_r of fragment f, then its mean over ranks:
  // here (delay 0) or on the async engine.
  template <class Tr>
  void start(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, std::size_t f,
             std::uint64_t step) {
    V* delta = delta_.data();
    const V* anchor = anchor_.data();
    for (std::size_t k = first_piece_[f]; k < first_piece_[f + 1]; ++k) {
      const piece& p = pieces_[k];
      const V* local = params[p.tensor].data() + p.begin;
      for (std::size_t e = 0; e < p.count; ++e) delta[p.flat + e] = anchor[p.flat + e] - local[e];
    }
    flight_[f] = {true, step + schedule_.delay};
    if (comm.size() == 1) return;  // the mean of one
    const reduction r = reduction_of(f);
    if (schedule_.delay == 0)
      reduce(comm, r);
    else
      handles_[f] = comm.async().submit([r](collective::communicator<Tr>& c) { reduce(c, r); });
  }

  // The outer optimizer steps the anchor with the mean pseudo-gradient; the fragment's
  // parameters become the new anchor (this replica's inner steps on it since the start
  // are dropped), so every replica holds the same values for it.
  template <class Tr>
  void land(collective::communicator<Tr>& comm, std::span<const std::span<V>> params, std::size_t f) {
    if (handles_[f].valid()) handles_[f].wait(comm.queued_collective_deadline());
    for (std::size_t k = first_piece_[f]; k < first_piece_[f + 1]; ++k) {
      const piece& p = pieces_[k];
      const std::span<V> anchor(anchor_.data() + p.flat, p.count);
      outer_.step(states_[k], anchor, std::span<const V>(delta_.data() + p.flat, p.count), V(1));
      std::copy(anchor.begin(), anchor.end(), params[p.tensor].begin() + static_cast<std::ptrdiff_t>(p.begin));
    }
    flight_[f].started = false;
  }

  Outer outer_;
  fragment_schedule schedule_;
  std::size_t chunk_;
  std::conditional_t<compressed, std::unique_ptr<Codec>, none> codec_;  // on the heap: see reduction
  std::vector<std::vector<buffer_type>> buffers_;  // [fragment][call], with a codec
  flat_layout layout_;                                     // the parameters in index order
  aligned_buffer<V> anchor_;                               // theta: the parameters of the last synchronisation
  aligned_buffer<V> delta_;                                // the pseudo-gradients, then their mean
  std::vector<piece> pieces_;                              // fragment after fragment
  std::vector<std::size_t> first_piece_;                   // [fragment], and the end
  std::vector<typename Outer::template state<V>> states_;  // [piece]: the outer optimizer's
  std::vector<flight> flight_;                             // [fragment]
  // Last, so destroyed first: each waits for its all-reduce before the buffers go.
  std::vector<collective::async_handle> handles_;  // [fragment]
};

}  // namespace gradwire::aggregation::detail
