// Checks that every rank entered the same collective with the same count, dtype and root.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "../error.hpp"
#include "../tensor/dtype.hpp"
#include "communicator.hpp"

namespace gradwire::collective {

enum class operation : std::uint32_t { all_reduce = 1, broadcast, barrier, reduce_scatter, all_gather, reduce };
enum class reduce_op : std::uint32_t { sum = 1, average };
// Which all-reduce algorithm a rank runs: ranks that choose differently (e.g. different
// auto_ thresholds) would exchange different messages, so the check compares it too.
enum class algorithm_id : std::uint8_t { none = 0, ring, halving_doubling, one_shot, hierarchical };

inline const char* name_of(operation op) noexcept {
  switch (op) {
    case operation::all_reduce: return "all_reduce";
    case operation::broadcast: return "broadcast";
    case operation::barrier: return "barrier";
    case operation::reduce_scatter: return "reduce_scatter";
    case operation::all_gather: return "all_gather";
    case operation::reduce: return "reduce";
  }
  return "?";
}

inline const char* name_of(reduce_op op) noexcept { return op == reduce_op::sum ? "sum" : "average"; }

inline const char* name_of(algorithm_id a) noexcept {
  switch (a) {
    case algorithm_id::none: return "none";
    case algorithm_id::ring: return "ring";
    case algorithm_id::halving_doubling: return "halving_doubling";
    case algorithm_id::one_shot: return "one_shot";
    case algorithm_id::hierarchical: return "hierarchical";
  }
  return "?";
}

// What a rank says it is doing; exchanged before the data when verification is on.
struct call_descriptor {
  operation op{};
  std::uint32_t argument = 0;  // reduce_op for reductions, root for broadcast
  std::uint64_t count = 0;
  dtype type{};
  algorithm_id algorithm = algorithm_id::none;  // all_reduce only
  std::uint8_t padding[6] = {};

  friend bool operator==(const call_descriptor& a, const call_descriptor& b) {
    return a.op == b.op && a.argument == b.argument && a.count == b.count && a.type == b.type &&
           a.algorithm == b.algorithm;
  }

  std::string to_string() const {
    std::string s = std::string(name_of(op)) + "(count=" + std::to_string(count) + ", dtype=" + name_of(type);
    if (op == operation::all_reduce || op == operation::reduce_scatter)
      s += std::string(", op=") + name_of(static_cast<reduce_op>(argument));
    if (op == operation::broadcast) s += ", root=" + std::to_string(argument);
    s += ")";
    if (algorithm != algorithm_id::none) s += std::string(" by ") + name_of(algorithm);
    return s;
  }
};

namespace detail {
// Steps of an operation's tag space used by the check (data steps count up from 0).
inline constexpr std::uint32_t verify_from_left = 0xfff0;
inline constexpr std::uint32_t verify_from_right = 0xfff1;
// From a rank that is not a ring neighbour (one-shot checks every peer it sends data to).
inline constexpr std::uint32_t verify_from_far = 0xfff2;

// Throws errc::mismatch naming both calls unless `theirs` (rank `peer`'s) equals `mine`;
// only the two ranks see the disagreement, so it tells every rank first where the
// transport can.
template <class Tr>
void check_same_call(Tr& t, std::uint64_t sequence, int me, int peer, const call_descriptor& mine,
                     const call_descriptor& theirs) {
  if (theirs == mine) return;
  const std::string what = "collective mismatch: rank " + std::to_string(me) + " called " + mine.to_string() +
                           " but rank " + std::to_string(peer) + " called " + theirs.to_string() + " (operation #" +
                           std::to_string(sequence) + ")";
  if constexpr (concepts::failable_transport<Tr>) t.fail(errc::mismatch, what);
  throw error(errc::mismatch, what);
}
}  // namespace detail

// The call check, and how it costs no round trip.
//
// Every collective, whatever its algorithm, opens by exchanging one check frame with
// each ring neighbour (with only one neighbour, N = 2, a single frame each way): the
// rank's call_descriptor followed by up to check_inline_bytes of its data. The frame
// has one fixed size and the same two tags (verify_from_left, verify_from_right) in
// every collective, so any two neighbours meet in it whatever each of them called: a
// different count, dtype, root, algorithm or even operation (all_reduce beside
// broadcast) arrives as a descriptor to compare, never as a bare size mismatch or a
// message nobody receives (a hang). If every rank agrees with its neighbours, all
// ranks agree; if two neighbours disagree, both throw errc::mismatch naming both ranks
// and both calls, and transports that propagate a rank's failure (failable_transport)
// fail the others with that same mismatch.
//
// Why frames and not a transport capability that prefixes a header to a data message:
// the frame works over every transport as it is (inproc, asio_tcp, ucx, mpi, the
// simulation), and a fixed-size frame always matches its receive, which a header glued
// to data of a disagreeing size would not without new receive semantics in each
// backend. The cost goes where latency lives:
// - small data (one_shot_all_reduce, at most check_inline_bytes) rides inside the frame
//   itself, so a verified tiny all-reduce on 2 ranks is one message each way, as an
//   unverified one is (before: three each way);
// - larger data: the frame is posted beside the first data message rather than in a
//   round before it (call_check is constructed, the data posted, then finish() checks
//   before any data is waited for), one extra small message per neighbour, no round trip.
// The frame is waited for before any data so a disagreement is reported as the calls'
// mismatch: a neighbour's frame travels ahead of its data on the same link.
// Not movable: the transports hold its buffers.
// 64 bytes: every collective pays two frames, so the frame is kept small (with 256 bytes
// the tutorial's top-k at 1% density sent 12.5% of a dense all-reduce's bytes, frames
// included, on a 1001-parameter model; with 64, under 10%).
inline constexpr std::size_t check_inline_bytes = 64;

struct check_frame {
  call_descriptor call;
  std::byte data[check_inline_bytes];
};

template <class Tr>
class call_check {
 public:
  // `inline_data` (at most check_inline_bytes) travels in the frames to both neighbours.
  call_check(communicator<Tr>& comm, std::uint64_t sequence, const call_descriptor& mine,
             std::span<const std::byte> inline_data = {})
      : comm_(comm), sequence_(sequence) {
    const int n = comm.size(), me = comm.rank();
    left_ = (me + n - 1) % n;
    right_ = (me + 1) % n;
    if (inline_data.size() > check_inline_bytes)
      throw error(errc::invalid_argument, "call_check: at most " + std::to_string(check_inline_bytes) +
                                              " bytes of data ride in the check frame");
    mine_.call = mine;
    std::memcpy(mine_.data, inline_data.data(), inline_data.size());
    auto& t = comm.transport();
    const auto mine_bytes = std::as_bytes(std::span(&mine_, 1));
    from_left_request_.emplace(t.async_recv(left_, make_tag(sequence, detail::verify_from_left),
                                            std::as_writable_bytes(std::span(&from_left_, 1))));
    if (right_ != left_)
      from_right_request_.emplace(t.async_recv(right_, make_tag(sequence, detail::verify_from_right),
                                               std::as_writable_bytes(std::span(&from_right_, 1))));
    to_right_.emplace(t.async_send(right_, make_tag(sequence, detail::verify_from_left), mine_bytes));
    if (right_ != left_)
      to_left_.emplace(t.async_send(left_, make_tag(sequence, detail::verify_from_right), mine_bytes));
  }
  call_check(const call_check&) = delete;
  call_check& operator=(const call_check&) = delete;

  void finish() {
    auto& t = comm_.transport();
    const auto until = comm_.step_deadline();
    // Each neighbour's call is checked as soon as it arrives: a rank that fails withdraws
    // its own pending operations, so waiting for both first could turn a mismatch into
    // a lost peer.
    t.wait(*from_left_request_, until);
    detail::check_same_call(t, sequence_, comm_.rank(), left_, mine_.call, from_left_.call);
    if (from_right_request_) {
      t.wait(*from_right_request_, until);
      detail::check_same_call(t, sequence_, comm_.rank(), right_, mine_.call, from_right_.call);
    }
    t.wait(*to_right_, until);
    if (to_left_) t.wait(*to_left_, until);
  }

  // The data a neighbour put in its frame (valid after finish(); `bytes` as agreed).
  std::span<const std::byte> inline_from(int peer, std::size_t bytes) const {
    const check_frame& f = peer == left_ ? from_left_ : from_right_;
    return std::span<const std::byte>(f.data, std::min(bytes, check_inline_bytes));
  }
  int left() const noexcept { return left_; }
  int right() const noexcept { return right_; }

 private:
  communicator<Tr>& comm_;
  std::uint64_t sequence_;
  check_frame mine_{}, from_left_{}, from_right_{};
  int left_ = 0, right_ = 0;
  std::optional<typename Tr::request> from_left_request_, from_right_request_, to_right_, to_left_;
};

// The call check with the ranks beyond the two ring neighbours, for an algorithm that
// sends them data (one-shot on N >= 4): a descriptor-only frame each way on
// verify_from_far, posted before that data and compared before it is waited for, so a
// far rank that disagrees (another count) is reported as the calls' mismatch naming both,
// not as a bare size mismatch of its data, and not only once a neighbour's report comes
// round. At most MaxRanks ranks (the frames live here, not on the heap).
template <class Tr, int MaxRanks>
class far_call_check {
 public:
  far_call_check(communicator<Tr>& comm, std::uint64_t sequence, const call_descriptor& mine, int left, int right)
      : comm_(comm), sequence_(sequence), left_(left), right_(right) {
    if (comm.size() > MaxRanks)
      throw error(errc::invalid_argument, "far_call_check: at most " + std::to_string(MaxRanks) + " ranks");
    mine_.call = mine;
    auto& t = comm.transport();
    const auto tag = make_tag(sequence, detail::verify_from_far);
    for (int r = 0; r < comm.size(); ++r)
      if (is_far(r)) {
        receives_[r] = t.async_recv(r, tag, std::as_writable_bytes(std::span(&theirs_[r], 1)));
        sends_[r] = t.async_send(r, tag, std::as_bytes(std::span(&mine_, 1)));
      }
  }
  far_call_check(const far_call_check&) = delete;
  far_call_check& operator=(const far_call_check&) = delete;

  void finish() {
    auto& t = comm_.transport();
    const auto until = comm_.step_deadline();
    for (int r = 0; r < comm_.size(); ++r)
      if (is_far(r)) {
        t.wait(receives_[r], until);
        detail::check_same_call(t, sequence_, comm_.rank(), r, mine_.call, theirs_[r].call);
      }
    for (int r = 0; r < comm_.size(); ++r)
      if (is_far(r)) t.wait(sends_[r], until);
  }

 private:
  bool is_far(int r) const noexcept { return r != comm_.rank() && r != left_ && r != right_; }

  communicator<Tr>& comm_;
  std::uint64_t sequence_;
  int left_, right_;
  check_frame mine_{};
  std::array<check_frame, MaxRanks> theirs_;
  std::array<typename Tr::request, MaxRanks> receives_, sends_;
};

// Posts the call check into `check` when the communicator's options ask for it (and
// there is more than one rank). The algorithm then posts its first data messages and
// calls settle_call_check before it waits for any data: the check rides beside the
// data instead of a round before it.
template <class Tr>
void post_call_check(std::optional<call_check<Tr>>& check, communicator<Tr>& comm, std::uint64_t sequence,
                     const call_descriptor& mine) {
  if (comm.size() > 1 && comm.options().verify) check.emplace(comm, sequence, mine);
}

// Waits for a posted check and compares; nothing when none is posted or it is settled.
template <class Tr>
void settle_call_check(std::optional<call_check<Tr>>& check) {
  if (!check) return;
  check->finish();
  check.reset();
}

// Runs the call check (when the communicator's options ask for it) before an algorithm
// exchanges any data: a round of its own, for the collectives that do not yet post their
// first data before settling the check (broadcast, reduce, reduce_scatter, all_gather,
// barrier, hierarchical).
// (Constructed directly, not through an optional: GCC 12 warns that a local optional's
// nested requests "may be used uninitialized" after inlining.)
template <class Tr>
void verify_same_call(communicator<Tr>& comm, std::uint64_t sequence, const call_descriptor& mine) {
  if (comm.size() == 1 || !comm.options().verify) return;
  call_check<Tr> check(comm, sequence, mine);
  check.finish();
}

}  // namespace gradwire::collective
