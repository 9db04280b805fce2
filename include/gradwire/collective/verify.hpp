// Checks that every rank entered the same collective with the same count, dtype and root.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../config.hpp"
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

// Every reduction's entry: an op outside the enum (an integer cast from a config, say) is
// refused, not run as a sum by one algorithm and an average by another.
inline void require_known(reduce_op op, const char* collective) {
  if (op != reduce_op::sum && op != reduce_op::average)
    throw error(errc::invalid_argument, std::string(collective) + ": unknown reduce_op " +
                                            std::to_string(static_cast<std::uint32_t>(op)) +
                                            " (reduce_op::sum or reduce_op::average)");
}

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

// What a rank says it is doing; sent beside its first data when verification is on.
struct call_descriptor {
  operation op{};
  std::uint32_t argument = 0;  // reduce_op for reductions, root for broadcast
  std::uint64_t count = 0;
  dtype type{};
  algorithm_id algorithm = algorithm_id::none;  // all_reduce only
  // The ring's pipeline segments (detail/ring.hpp; 0 or 1: none): they follow from the
  // transport type, and ranks that cut differently would exchange different messages.
  std::uint8_t segments = 0;
  std::uint8_t padding[5] = {};

  friend bool operator==(const call_descriptor& a, const call_descriptor& b) {
    return a.op == b.op && a.argument == b.argument && a.count == b.count && a.type == b.type &&
           a.algorithm == b.algorithm && a.segments == b.segments;
  }

  GRADWIRE_DECL std::string to_string() const;
};

namespace detail {
// Steps of an operation's tag space used by the check (data steps count up from 0).
inline constexpr std::uint32_t verify_from_left = 0xfff0;
inline constexpr std::uint32_t verify_from_right = 0xfff1;
// From a far peer: a rank beyond the ring neighbours that sends this rank data (call_check).
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
// Ranks beyond the two neighbours that an algorithm exchanges data with (a tree's
// parent and children, halving-doubling's partners, one-shot's every peer, the
// hierarchical rings) are its far peers: each such pair also exchanges descriptor-only
// frames on verify_from_far, posted before the data and compared before any data is
// waited for. So a far peer that disagrees about the count or dtype is reported as the
// calls' mismatch naming both, on both sides, not as a bare size mismatch of the data
// (which a transport reports to its sender as well as its receiver), and not only once a
// neighbour's report comes round. (Ranks that disagree about the root or the algorithm
// may list different far peers; a far frame waited for in vain then ends with the
// mismatch a neighbour found and propagated, or at the deadline on a transport that
// cannot propagate failures.)
//
// Without a round before the data, a rank whose own exchanges all agreed may complete
// its part of a collective (a leaf of a tree whose parent took its message) before
// another rank finds a mismatch; the failure then reaches it in its next call.
//
// Why frames and not a transport capability that prefixes a header to a data message:
// the frame works over every transport as it is (inproc, asio_tcp, ucx, mpi, the
// simulation), and a fixed-size frame always matches its receive, which a header glued
// to data of a disagreeing size would not without new receive semantics in each
// backend. The cost goes where latency lives:
// - small data (one_shot_all_reduce, a small broadcast's first hop) rides inside the
//   frame itself, so a verified tiny all-reduce on 2 ranks is one message each way, as
//   an unverified one is (before: three each way);
// - larger data: the frames are posted beside the first data messages rather than in a
//   round before them (the check is constructed, the data posted, then finish() checks
//   before any data is waited for): one extra small message per neighbour and far
//   peer, no round trip. Every collective works this way.
// The frames are waited for before any data so a disagreement is reported as the calls'
// mismatch: a peer's frame travels ahead of its data on the same link.
// Not movable: the transports hold its buffers.
// 64 bytes: every collective pays a frame to and from each neighbour (far frames carry
// the descriptor only), so the frame is kept small (with 256 bytes
// the tutorial's top-k (then a whole-step aggregation) at 1% density sent 12.5% of a dense all-reduce's bytes, frames
// included, on a 1001-parameter model; with 64, under 10%).
inline constexpr std::size_t check_inline_bytes = 64;

struct check_frame {
  call_descriptor call;
  std::byte data[check_inline_bytes];
};

// The peers an algorithm exchanges data with, either way: those that are not ring
// neighbours (nor this rank) exchange far frames with it. Repeats are fine. The relation
// must be symmetric: rank a lists b exactly when b lists a (it is for every algorithm
// here, whose peers follow from the descriptor and the topology alone).
using far_peers = std::span<const int>;

template <class Tr>
class call_check {
 public:
  // `inline_data` (at most check_inline_bytes) travels in the frames to both neighbours.
  call_check(communicator<Tr>& comm, std::uint64_t sequence, const call_descriptor& mine,
             std::span<const std::byte> inline_data = {}, far_peers far = {})
      : comm_(comm), sequence_(sequence) {
    const int n = comm.size(), me = comm.rank();
    left_ = (me + n - 1) % n;
    right_ = (me + 1) % n;
    if (inline_data.size() > check_inline_bytes)
      throw error(errc::invalid_argument, "call_check: at most " + std::to_string(check_inline_bytes) +
                                              " bytes of data ride in the check frame");
    mine_.call = mine;
    if (!inline_data.empty()) std::memcpy(mine_.data, inline_data.data(), inline_data.size());  // may be null
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
    post_far(far);
  }
  call_check(const call_check&) = delete;
  call_check& operator=(const call_check&) = delete;

  void finish() {
    auto& t = comm_.transport();
    const auto until = comm_.step_deadline();
    // Each peer's call is checked as soon as it arrives: a rank that fails withdraws its
    // own pending operations, so waiting for all first could turn a mismatch into a lost
    // peer. Neighbours first: every collective has them, so a rank in another collective
    // is reported from there.
    t.wait(*from_left_request_, until);
    detail::check_same_call(t, sequence_, comm_.rank(), left_, mine_.call, from_left_.call);
    if (from_right_request_) {
      t.wait(*from_right_request_, until);
      detail::check_same_call(t, sequence_, comm_.rank(), right_, mine_.call, from_right_.call);
    }
    for (far_peer& p : far_) {
      t.wait(*p.receive, until);
      detail::check_same_call(t, sequence_, comm_.rank(), p.rank, mine_.call, p.theirs);
    }
    t.wait(*to_right_, until);
    if (to_left_) t.wait(*to_left_, until);
    for (far_peer& p : far_) t.wait(*p.send, until);
  }

  // The data a neighbour put in its frame (valid after finish(); `bytes` as agreed).
  std::span<const std::byte> inline_from(int peer, std::size_t bytes) const {
    const check_frame& f = peer == left_ ? from_left_ : from_right_;
    return std::span<const std::byte>(f.data, std::min(bytes, check_inline_bytes));
  }
  int left() const noexcept { return left_; }
  int right() const noexcept { return right_; }

 private:
  bool is_far(int r) const noexcept { return r != comm_.rank() && r != left_ && r != right_; }

  // A peer beyond the ring neighbours: its frame carries the descriptor only.
  struct far_peer {
    int rank;
    call_descriptor theirs{};
    std::optional<typename Tr::request> receive, send;
  };

  // Lists are short (a tree's log2 N edges, at most N - 3 for one-shot): a linear search
  // drops repeats. Every peer is listed before any frame is posted, as the transports
  // hold pointers into the list.
  void post_far(far_peers far) {
    far_.reserve(far.size());
    for (int r : far)
      if (is_far(r) && std::none_of(far_.begin(), far_.end(), [r](const far_peer& p) { return p.rank == r; }))
        far_.push_back({r, {}, std::nullopt, std::nullopt});
    auto& t = comm_.transport();
    const auto tag = make_tag(sequence_, detail::verify_from_far);
    for (far_peer& p : far_) p.receive.emplace(t.async_recv(p.rank, tag, std::as_writable_bytes(std::span(&p.theirs, 1))));
    for (far_peer& p : far_) p.send.emplace(t.async_send(p.rank, tag, std::as_bytes(std::span(&mine_.call, 1))));
  }

  communicator<Tr>& comm_;
  std::uint64_t sequence_;
  check_frame mine_{}, from_left_{}, from_right_{};
  int left_ = 0, right_ = 0;
  std::optional<typename Tr::request> from_left_request_, from_right_request_, to_right_, to_left_;
  std::vector<far_peer> far_;
};

// Posts the call check into `check` when the communicator's options ask for it (and
// there is more than one rank). The algorithm then posts its first data messages and
// calls settle_call_check before it waits for any data: the check rides beside the
// data instead of a round before it.
template <class Tr>
void post_call_check(std::optional<call_check<Tr>>& check, communicator<Tr>& comm, std::uint64_t sequence,
                     const call_descriptor& mine, far_peers far = {}, std::span<const std::byte> inline_data = {}) {
  if (comm.size() > 1 && comm.options().verify) check.emplace(comm, sequence, mine, inline_data, far);
}

// Waits for a posted check and compares; nothing when none is posted or it is settled.
template <class Tr>
void settle_call_check(std::optional<call_check<Tr>>& check) {
  if (!check) return;
  check->finish();
  check.reset();
}

}  // namespace gradwire::collective

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "verify.ipp"
#endif
