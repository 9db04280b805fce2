// Broadcast from a root over a binomial tree: ceil(log2 N) rounds.
#pragma once

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "communicator.hpp"
#include "detail/binomial_tree.hpp"
#include "verify.hpp"

namespace gradwire::collective {

template <class Tr, class V>
void broadcast(communicator<Tr>& comm, std::span<V> data, int root = 0) {
  const int n = comm.size();
  if (root < 0 || root >= n)
    throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root) + " outside 0.." + std::to_string(n - 1));
  auto trace = comm.trace("broadcast", data.size_bytes());
  trace.arg("root", root);
  const std::uint64_t sequence = comm.begin_operation();
  if (n == 1) return;
  const detail::binomial_tree tree(n, comm.rank(), root);
  const int parent = tree.parent();
  const int relative = (comm.rank() - root + n) % n;

  // The call check rides beside the data (verify.hpp): tree peers beyond the ring
  // neighbours get far frames. Data that fits in the check frame reaches the root's right
  // neighbour (relative 1, a leaf) inside it: on 2 ranks the root sends one message,
  // checked or not (checked, the leaf sends its frame back).
  const bool small = data.size_bytes() <= check_inline_bytes;
  std::optional<call_check<Tr>> check;
  post_call_check(check, comm, sequence,
                  {operation::broadcast, static_cast<std::uint32_t>(root), data.size(), dtype_of_v<V>}, tree.peers(),
                  parent < 0 && small ? std::as_bytes(std::span<const V>(data)) : std::span<const std::byte>{});
  const bool in_frame = check && small;
  auto& t = comm.transport();
  const auto tag = make_tag(sequence, 0);
  std::vector<typename Tr::request> sends;
  auto forward = [&] {
    sends.reserve(tree.children().size());
    for (int child : tree.children())
      if (!(in_frame && child == tree.rank_of(1))) sends.push_back(t.async_send(child, tag, std::as_bytes(data)));
  };
  if (parent < 0) {
    forward();
    settle_call_check(check);
  } else if (in_frame && relative == 1) {
    check->finish();
    const auto bytes = check->inline_from(parent, data.size_bytes());
    if (!bytes.empty()) std::memcpy(data.data(), bytes.data(), bytes.size());  // both may be null
    check.reset();
  } else {
    auto received = t.async_recv(parent, tag, std::as_writable_bytes(data));
    settle_call_check(check);
    t.wait(received, comm.step_deadline());
    forward();
  }
  const auto until = comm.step_deadline();
  for (auto& s : sends) t.wait(s, until);
}

}  // namespace gradwire::collective
