// The simulated ranks' messages: operations, receives waiting for their send, sends waiting for their receive.
//
// Sends are eager: a send whose receive is not posted yet leaves a copy of its bytes here
// (a staged message) and completes as its bytes leave the sender. A send and a receive
// with the same (source, destination, tag) match in the order they were posted, as on
// every gradwire transport. Queues exist only for the pairs of ranks that talk, so a job's
// memory grows with its traffic pattern, not with the square of its ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../error.hpp"
#include "../detail/deliver.hpp"
#include "cluster_model.hpp"

namespace gradwire::simulation::detail {

inline constexpr time_point never = time_point::max();

struct sim_op {
  bool is_send = false;
  int source = 0, destination = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;  // a send's bytes are only read through it
  std::size_t bytes = 0;
  transport::detail::deliver_fn deliver = transport::detail::deliver_copy;
  bool done = false;  // completes at complete_at (maybe later than now)
  time_point complete_at = never;
  errc failure{};
  std::string failure_message;
  // A queued receive that nothing may match after doom_at (its peer is gone, as its rank
  // learns then): it fails then unless a message arrives first.
  time_point doom_at = never;
  errc doom_cause = errc::peer_lost;
  std::string doom_message;

  int owner() const noexcept { return is_send ? source : destination; }
  int peer() const noexcept { return is_send ? destination : source; }

  void fail(time_point at, errc cause, std::string message) {
    failure = cause;
    failure_message = std::move(message);
    done = true;
    complete_at = at;
  }
};

// A message that arrived before its receive was posted.
struct staged_message {
  std::uint64_t tag = 0;
  std::vector<std::byte> bytes;
  time_point arrives{};
};

class mailbox {
 public:
  explicit mailbox(int ranks) : ranks_(ranks) {}

  // The first queued receive from `from` to `to` with `tag`, taken off its queue; null if none.
  sim_op* take_receive(int from, int to, std::uint64_t tag) {
    auto it = receives_.find(key(from, to));
    if (it == receives_.end()) return nullptr;
    auto& q = it->second;
    auto match = std::find_if(q.begin(), q.end(), [&](sim_op* o) { return o->tag == tag; });
    if (match == q.end()) return nullptr;
    sim_op* op = *match;
    q.erase(match);
    return op;
  }

  void queue_receive(sim_op& op) { receives_[key(op.source, op.destination)].push_back(&op); }

  // Takes `op` off its queue if it is there.
  void unqueue_receive(sim_op& op) {
    auto it = receives_.find(key(op.source, op.destination));
    if (it == receives_.end()) return;
    auto& q = it->second;
    q.erase(std::remove(q.begin(), q.end(), &op), q.end());
  }

  // Calls fn(op) for every queued receive of rank `to` (fn may not queue or unqueue).
  template <class Fn>
  void for_each_receive_of(int to, Fn&& fn) {
    for (auto& [k, q] : receives_)
      if (static_cast<int>(k % static_cast<std::uint64_t>(ranks_)) == to)
        for (sim_op* op : q) fn(*op);
  }

  // Forgets every receive rank `to` left queued (it finished: its buffers may be gone).
  void drop_receives_of(int to) {
    for (auto& [k, q] : receives_)
      if (static_cast<int>(k % static_cast<std::uint64_t>(ranks_)) == to) q.clear();
  }

  // Forgets the messages staged from `from` to `to` (a process that is gone sent them).
  void drop_staged(int from, int to) {
    auto it = staged_.find(key(from, to));
    if (it == staged_.end()) return;
    for (auto& m : it->second) give_buffer(std::move(m.bytes));
    it->second.clear();
  }

  void stage(int from, int to, std::uint64_t tag, const std::byte* bytes, std::size_t size, time_point arrives) {
    staged_message m;
    m.tag = tag;
    m.bytes = take_buffer(size);
    if (size) std::memcpy(m.bytes.data(), bytes, size);
    m.arrives = arrives;
    staged_[key(from, to)].push_back(std::move(m));
  }

  // The first staged message from `from` to `to` with `tag`, taken off its queue; fn(message)
  // is called on it before its buffer goes back to the pool. Returns whether there was one.
  template <class Fn>
  bool take_staged(int from, int to, std::uint64_t tag, Fn&& fn) {
    auto it = staged_.find(key(from, to));
    if (it == staged_.end()) return false;
    auto& q = it->second;
    auto match = std::find_if(q.begin(), q.end(), [&](const staged_message& m) { return m.tag == tag; });
    if (match == q.end()) return false;
    staged_message m = std::move(*match);
    q.erase(match);
    fn(m);
    give_buffer(std::move(m.bytes));
    return true;
  }

  // Messages between a pair arrive in the order they were sent (a short one sent after a
  // long one waits for it, as on one connection): the arrival of the pair's next message.
  time_point in_order(int from, int to, time_point arrives) {
    time_point& last = last_arrival_[key(from, to)];
    last = std::max(last, arrives);
    return last;
  }

 private:
  // Staged buffers kept for reuse: enough for a round of a collective on many ranks, few
  // enough that an idle job holds little memory.
  static constexpr std::size_t pooled_buffers = 256;

  std::uint64_t key(int from, int to) const noexcept {
    return static_cast<std::uint64_t>(from) * static_cast<std::uint64_t>(ranks_) + static_cast<std::uint64_t>(to);
  }

  std::vector<std::byte> take_buffer(std::size_t bytes) {
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->capacity() >= bytes) {
        std::vector<std::byte> b = std::move(*it);
        pool_.erase(it);
        b.resize(bytes);
        return b;
      }
    return std::vector<std::byte>(bytes);
  }
  void give_buffer(std::vector<std::byte> b) {
    if (pool_.size() < pooled_buffers) pool_.push_back(std::move(b));
  }

  int ranks_;
  std::unordered_map<std::uint64_t, std::deque<sim_op*>> receives_;     // posted, unmatched
  std::unordered_map<std::uint64_t, std::deque<staged_message>> staged_;  // sent, unreceived
  std::unordered_map<std::uint64_t, time_point> last_arrival_;
  std::vector<std::vector<std::byte>> pool_;
};

}  // namespace gradwire::simulation::detail
