// Alpha-beta-contention pricing of one round of messages on a cluster_model's links.
//
// The simulator's network (transport/simulated/network.hpp) sends a message of n bytes from rank
// a to rank b across hosts through host(a)'s egress link and then host(b)'s ingress link,
// each a FIFO of reservations of n / bandwidth (full duplex); between ranks of one host
// through a's local egress port and b's local ingress port. A sender spends `overhead` of
// CPU per message before it enters its link (one after another on its clock); a receive
// completes `overhead` after its message arrived (receives do not queue behind each
// other: transport/simulated/scheduler.hpp).
//
// A round is a set of messages posted together that every rank waits for before its next
// round (a halving step, a push phase). It is priced as that network would carry it:
// sender r posts its k-th message of the round at k * overhead; each egress link takes
// its messages in posting order, each ingress link in order of their earliest start
// (egress start + latency), each message n / bandwidth on both (two FIFO queues in
// tandem); the round ends `overhead` after the last arrival. So a message alone takes
// 2 overhead + latency + n / bandwidth, k messages through one link k times their bytes
// (contention), and a message may wait on its egress and then again on its ingress
// (one-shot's all-to-all, parameter-server pushes). How rounds follow each other is the
// schedule's business (schedule.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "cluster_model.hpp"

namespace gradwire::plan {

// One message of a round: `bytes` from rank `from` to rank `to` (ranks past the cluster's
// last rank are placed host-major too: rank r on host r / ranks_per_host).
struct message {
  int from = 0, to = 0;
  double bytes = 0;
};

inline double seconds_of(duration d) noexcept { return double(d.count()) * 1e-9; }

// What a steady state puts on each link and each rank's CPU: messages added at their rate
// per second (an asynchronous parameter server's pushes and replies); utilisation() says
// how busy the busiest resource is.
class link_loads {
 public:
  explicit link_loads(const cluster_model& c) : c_(c) {}

  void add(const message& m, double weight = 1) {
    const int top = std::max(m.from, m.to);
    grow(top);
    const auto a = static_cast<std::size_t>(m.from), b = static_cast<std::size_t>(m.to);
    sends_[a] += weight;
    if (c_.host(m.from) == c_.host(m.to)) {
      local_out_[a] += weight * m.bytes;
      local_in_[b] += weight * m.bytes;
    } else {
      network_out_[static_cast<std::size_t>(c_.host(m.from))] += weight * m.bytes;
      network_in_[static_cast<std::size_t>(c_.host(m.to))] += weight * m.bytes;
    }
  }
  void add(std::span<const message> messages, double weight = 1) {
    for (const auto& m : messages) add(m, weight);
  }

  // With weights in messages per second: the busiest link's bytes per second over its
  // bandwidth, or the busiest rank's CPU seconds per second spent sending (receives take
  // no CPU of their own in the simulator); 1 is saturated.
  double utilisation() const {
    double u = std::max(busiest(local_out_, local_in_) / c_.local.bandwidth,
                        busiest(network_out_, network_in_) / c_.network.bandwidth);
    const double o = seconds_of(c_.overhead);
    for (double s : sends_) u = std::max(u, o * s);
    return u;
  }

 private:
  void grow(int rank) {
    const auto ranks = static_cast<std::size_t>(rank) + 1;
    if (ranks <= sends_.size()) return;
    const auto hosts = static_cast<std::size_t>(c_.host(rank)) + 1;
    for (auto* v : {&sends_, &local_out_, &local_in_}) v->resize(ranks, 0);
    for (auto* v : {&network_out_, &network_in_}) v->resize(std::max(v->size(), hosts), 0);
  }
  static double busiest(const std::vector<double>& out, const std::vector<double>& in) {
    double most = 0;
    for (double b : out) most = std::max(most, b);
    for (double b : in) most = std::max(most, b);
    return most;
  }

  const cluster_model& c_;
  std::vector<double> sends_;                     // [rank]: messages sent
  std::vector<double> local_out_, local_in_;      // [rank]: bytes on its local ports
  std::vector<double> network_out_, network_in_;  // [host]: bytes on its network link
};

// When each message of a round has left its sender and arrived: sender r posts its k-th
// message at ready[r] + k * overhead (ready empty: every sender at 0; see the top of this
// header). `busy` carries when each link is next free from round to round (none: the
// links are free when the round begins): a rank that finished a round early queues its
// next messages behind what other ranks still send on the same link.
struct message_time {
  double sent = 0, arrived = 0;
};

// Link -> the time it is free again; a link is {kind, rank or host} (kind 0/1: local or
// network egress, 2/3: ingress).
using link_busy = std::map<std::pair<int, int>, double>;

inline std::vector<message_time> round_times(const cluster_model& c, std::span<const message> messages,
                                             std::span<const double> ready = {}, link_busy* busy = nullptr) {
  const double o = seconds_of(c.overhead);
  struct hop {
    int out_kind, out, in_kind, in;  // links: kind 0/1 local/network egress, 2/3 ingress; of a rank or host
    double post, length, latency, earliest;
    std::size_t order;
  };
  std::vector<hop> hops;
  hops.reserve(messages.size());
  std::vector<int> posted;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const message& m = messages[i];
    if (static_cast<std::size_t>(m.from) >= posted.size()) posted.resize(static_cast<std::size_t>(m.from) + 1, 0);
    const int k = ++posted[static_cast<std::size_t>(m.from)];
    const bool local = c.host(m.from) == c.host(m.to);
    const link_model& l = local ? c.local : c.network;
    const double start = ready.empty() ? 0 : ready[static_cast<std::size_t>(m.from)];
    hops.push_back({local ? 0 : 1, local ? m.from : c.host(m.from), local ? 2 : 3, local ? m.to : c.host(m.to),
                    start + k * o, m.bytes / l.bandwidth, seconds_of(l.latency), 0, i});
  }
  std::vector<message_time> times(messages.size());
  std::vector<hop*> order(hops.size());
  for (std::size_t i = 0; i < hops.size(); ++i) order[i] = &hops[i];
  // Egress: per link, in posting order.
  auto by_egress = [](const hop* a, const hop* b) {
    if (a->out_kind != b->out_kind) return a->out_kind < b->out_kind;
    if (a->out != b->out) return a->out < b->out;
    return a->post != b->post ? a->post < b->post : a->order < b->order;
  };
  std::sort(order.begin(), order.end(), by_egress);
  auto free_of = [busy](int kind, int link) {
    if (!busy) return 0.0;
    const auto at = busy->find({kind, link});
    return at == busy->end() ? 0.0 : at->second;
  };
  auto keep = [busy](int kind, int link, double until) {
    if (busy) (*busy)[{kind, link}] = until;
  };
  double free_at = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    hop& h = *order[i];
    if (i == 0 || h.out_kind != order[i - 1]->out_kind || h.out != order[i - 1]->out) free_at = free_of(h.out_kind, h.out);
    const double start = std::max(h.post, free_at);
    free_at = times[h.order].sent = start + h.length;
    h.earliest = start + h.latency;
    if (i + 1 == order.size() || order[i + 1]->out_kind != h.out_kind || order[i + 1]->out != h.out)
      keep(h.out_kind, h.out, free_at);
  }
  // Ingress: per link, in order of earliest start.
  auto by_ingress = [](const hop* a, const hop* b) {
    if (a->in_kind != b->in_kind) return a->in_kind < b->in_kind;
    if (a->in != b->in) return a->in < b->in;
    return a->earliest != b->earliest ? a->earliest < b->earliest : a->order < b->order;
  };
  std::sort(order.begin(), order.end(), by_ingress);
  for (std::size_t i = 0; i < order.size(); ++i) {
    hop& h = *order[i];
    if (i == 0 || h.in_kind != order[i - 1]->in_kind || h.in != order[i - 1]->in) free_at = free_of(h.in_kind, h.in);
    free_at = times[h.order].arrived = std::max(h.earliest, free_at) + h.length;
    if (i + 1 == order.size() || order[i + 1]->in_kind != h.in_kind || order[i + 1]->in != h.in)
      keep(h.in_kind, h.in, free_at);
  }
  return times;
}

// The time of one round of `messages` on cluster `c`: `overhead` after the last arrival.
inline double round_seconds(const cluster_model& c, std::span<const message> messages) {
  double last = 0;
  for (const auto& t : round_times(c, messages)) last = std::max(last, t.arrived);
  return messages.empty() ? 0 : last + seconds_of(c.overhead);
}

}  // namespace gradwire::plan
