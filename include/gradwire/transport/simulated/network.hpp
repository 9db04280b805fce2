// The simulated network: when a message leaves its sender and when it arrives, with links shared in virtual time.
//
// Every host has a network link with an egress and an ingress direction (full duplex), and
// every rank a local port (egress, ingress) for messages to ranks of its own host. A link
// carries one message at a time: a message takes n / bandwidth on it, in the earliest gap
// of the link's reservations that starts no earlier than it can (a FIFO output queue that
// also fills gaps, so a message sent later in virtual time but processed earlier cannot
// push an earlier one back). A message of n bytes from a to b sent at t:
//   egress:  the earliest gap of length n/bw on a's side starting >= t           [s1, s1 + n/bw)
//   ingress: the earliest gap of length n/bw on b's side starting >= s1 + latency [s2, s2 + n/bw)
// It arrives at s2 + n/bw; the sender's operation completes at s1 + n/bw (its bytes have
// left). Alone, a message takes latency + n / bandwidth (the alpha-beta model); two flows
// into one host share its ingress and take 2n / bandwidth there; two flows out of one
// host share its egress. Messages are not split, so links are shared in turns of whole
// messages, not fairly: collectives send messages of similar sizes in rounds, where the
// two agree on when a round ends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "cluster_model.hpp"

namespace gradwire::simulation {

// The reservations of one link direction: disjoint busy intervals [begin, end).
class link_schedule {
 public:
  // Reserves the earliest interval of length `length` starting at or after `earliest`;
  // returns its start.
  time_point reserve(time_point earliest, duration length) {
    if (length.count() <= 0) return earliest;
    time_point start = earliest;
    // The interval that may contain `start`: the last one beginning at or before it.
    auto it = busy_.upper_bound(start);
    if (it != busy_.begin()) {
      auto before = std::prev(it);
      if (before->second > start) start = before->second;
    }
    for (; it != busy_.end() && it->first < start + length; ++it) start = std::max(start, it->second);
    // Merge with touching neighbours so the map stays short.
    time_point end = start + length;
    auto next = busy_.find(end);
    if (next != busy_.end()) {
      end = next->second;
      busy_.erase(next);
    }
    auto prev = busy_.lower_bound(start);
    if (prev != busy_.begin()) {
      auto p = std::prev(prev);
      if (p->second == start) {
        p->second = end;
        return start;
      }
    }
    busy_.emplace(start, end);
    return start;
  }

  // Forgets intervals that end before `horizon`: no reservation can start before it.
  void forget_before(time_point horizon) {
    auto it = busy_.begin();
    while (it != busy_.end() && it->second <= horizon) it = busy_.erase(it);
  }

 private:
  std::map<time_point, time_point> busy_;  // begin -> end
};

struct message_times {
  time_point sent;     // the sender's bytes have left (its operation completes)
  time_point arrived;  // the last byte is at the receiver
};

class network {
 public:
  explicit network(const cluster_model& model)
      : model_(model),
        host_egress_(static_cast<std::size_t>(model.hosts)),
        host_ingress_(static_cast<std::size_t>(model.hosts)),
        rank_egress_(static_cast<std::size_t>(model.size())),
        rank_ingress_(static_cast<std::size_t>(model.size())) {}

  // A message of `bytes` from rank `from` to rank `to`, sent at `at`.
  message_times send(int from, int to, std::size_t bytes, time_point at) {
    const bool local = model_.host(from) == model_.host(to);
    const link_model& link = local ? model_.local : model_.network;
    link_schedule& out = local ? rank_egress_[idx(from)] : host_egress_[idx(model_.host(from))];
    link_schedule& in = local ? rank_ingress_[idx(to)] : host_ingress_[idx(model_.host(to))];
    const duration length = link.transfer(bytes);
    const time_point left = out.reserve(at, length);
    const time_point landed = in.reserve(left + link.latency, length);
    if (++since_pruned_ >= prune_every) prune_pending_ = true;
    return {left + length, landed + length};
  }

  // Whether it is time to forget old reservations (forget_before), every prune_every messages.
  bool wants_pruning() const noexcept { return prune_pending_; }
  void forget_before(time_point horizon) {
    for (auto* links : {&host_egress_, &host_ingress_, &rank_egress_, &rank_ingress_})
      for (auto& l : *links) l.forget_before(horizon);
    since_pruned_ = 0;
    prune_pending_ = false;
  }

  const cluster_model& model() const noexcept { return model_; }

 private:
  static constexpr int prune_every = 4096;
  static std::size_t idx(int i) noexcept { return static_cast<std::size_t>(i); }

  const cluster_model& model_;
  std::vector<link_schedule> host_egress_, host_ingress_, rank_egress_, rank_ingress_;
  int since_pruned_ = 0;
  bool prune_pending_ = false;
};

}  // namespace gradwire::simulation
