// Reduce to one root: binomial tree for small messages, ring reduce-scatter + gather for large ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host.hpp"
#include "choice.hpp"
#include "chunking.hpp"
#include "communicator.hpp"
#include "detail/binomial_tree.hpp"
#include "detail/exchange.hpp"
#include "detail/ring.hpp"
#include "verify.hpp"

namespace gradwire::collective {

namespace detail {

// Binomial tree towards the root: ceil(log2 N) rounds; in round k, relative rank v with
// bit k set sends its partial sum to v - 2^k and drops out, the others add what v + 2^k
// sends. The root receives ceil(log2 N) whole buffers: latency-optimal, not bandwidth.
// The call check (when posted) gets far frames with the tree peers beyond the ring
// neighbours and is settled once the first message is posted.
template <class Tr, class V>
void tree_reduce(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, int root,
                 std::optional<call_check<Tr>>& check, const call_descriptor& mine) {
  const int n = comm.size(), relative = (comm.rank() - root + n) % n;
  const binomial_tree tree(n, comm.rank(), root);
  const int parent = tree.parent();
  post_call_check(check, comm, sequence, mine, tree.peers());

  auto& t = comm.transport();
  std::span<V> incoming;
  if constexpr (!concepts::accumulating_transport<Tr, V>) incoming = comm.template scratch<V>(data.size());
  std::uint32_t step = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++step) {
    const auto tag = make_tag(sequence, step);
    if (relative & mask) {
      auto sent = t.async_send(parent, tag, std::as_bytes(std::span<const V>(data)));
      settle_call_check(check);
      t.wait(sent, comm.step_deadline());
      return;
    }
    if (relative + mask >= n) continue;
    auto received = post_recv_accumulate(comm, tag, tree.rank_of(relative + mask), data, incoming);
    settle_call_check(check);
    complete_accumulate(comm, received, comm.step_deadline());
  }
  settle_call_check(check);  // every rank posted a message above; no path returns with it posted
}

// Ring reduce-scatter, then every rank sends its reduced chunk straight into place on
// the root: the root receives 2(N-1)/N of the buffer, independent of N.
// The ring's call check (settled beside its first step) covers the gather too: the root
// finishes the reduce-scatter only once every rank but its right neighbour (which it
// checked itself) has settled its check, so by then every ring edge agreed.
template <class Tr, class V>
void scatter_gather_reduce(communicator<Tr>& comm, std::uint64_t sequence, std::span<V> data, int root,
                           std::optional<call_check<Tr>>& check, const call_descriptor& mine) {
  const int n = comm.size(), me = comm.rank();
  post_call_check(check, comm, sequence, mine);
  std::uint32_t step = 0;
  ring_reduce_scatter(comm, sequence, step, data, reduce_op::sum, &check);
  settle_call_check(check);
  const chunking chunks{data.size(), static_cast<std::size_t>(n)};
  auto chunk = [&](int i) { return data.subspan(chunks.begin(i), chunks.length(i)); };
  const auto tag = make_tag(sequence, step);
  if (me != root) {
    if (!chunk(me).empty()) send(comm, root, tag, std::span<const V>(chunk(me)));
    return;
  }
  // All receives posted before any wait, so the senders' copies run in parallel. This
  // path runs for large messages only: the N small requests are noise beside the data.
  std::vector<typename Tr::request> receives;
  receives.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    if (r != root && !chunk(r).empty())
      receives.push_back(comm.transport().async_recv(r, tag, std::as_writable_bytes(chunk(r))));
  const auto until = comm.step_deadline();
  for (auto& r : receives) comm.transport().wait(r, until);
}

}  // namespace detail

// Reduces `data` element-wise across all ranks onto `root`: on return the root's `data`
// holds the sum (or average); every rank passes the same count, root and op. Other
// ranks' `data` is used as working space and holds partial sums afterwards (which ones
// depends on the algorithm): treat it as unspecified.
// Below communicator_options::small_all_reduce_bytes (and for N <= 2, where the tree
// moves no more) a binomial tree, ceil(log2 N) rounds; from there on, ring
// reduce-scatter + gather, N rounds but only 2(N-1)/N of the buffer into the root
// (reduce_takes_tree, choice.hpp).
template <class Tr, class V>
void reduce(communicator<Tr>& comm, std::span<V> data, int root, reduce_op op = reduce_op::sum) {
  require_known(op, "reduce");
  const int n = comm.size();
  if (root < 0 || root >= n)
    throw error(errc::invalid_argument, "reduce: root " + std::to_string(root) + " outside 0.." + std::to_string(n - 1));
  const bool tree = reduce_takes_tree(n, data.size_bytes(), comm.options().small_all_reduce_bytes);
  auto trace = comm.trace("reduce", data.size_bytes());
  trace.arg("algorithm", tree ? "tree" : "scatter_gather").arg("root", root);
  const std::uint64_t sequence = comm.begin_operation();
  // The descriptor has one argument: the root in the high bits, then the algorithm (ranks
  // with different thresholds would exchange different messages), then the reduce_op.
  const call_descriptor mine{
      operation::reduce, (static_cast<std::uint32_t>(root) << 8) | (tree ? 0u : 0x80u) | static_cast<std::uint32_t>(op),
      data.size(), dtype_of_v<V>};
  std::optional<call_check<Tr>> check;  // posted by the algorithm, beside its first data (verify.hpp)
  if (n == 1) return;                   // one rank: the sum and the average are the data
  if (data.empty()) {
    post_call_check(check, comm, sequence, mine);
    return settle_call_check(check);
  }
  if (tree)
    detail::tree_reduce(comm, sequence, data, root, check, mine);
  else
    detail::scatter_gather_reduce(comm, sequence, data, root, check, mine);
  if (op == reduce_op::average && comm.rank() == root) kernels::scale(data.data(), V(1) / V(n), data.size());
}

}  // namespace gradwire::collective
