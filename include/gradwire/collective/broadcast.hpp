// Broadcast from a root over a binomial tree: ceil(log2 N) rounds.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "communicator.hpp"
#include "detail/exchange.hpp"
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
  verify_same_call(comm, sequence, {operation::broadcast, static_cast<std::uint32_t>(root), data.size(), dtype_of_v<V>});
  if (n == 1) return;
  // Ranks relative to the root: relative rank v receives from v - mask where mask is
  // v's lowest set bit, then forwards to v + m for every smaller power of two m.
  const int me = comm.rank(), relative = (me - root + n) % n;
  const auto tag = make_tag(sequence, 0);
  int mask = 1;
  while (mask < n) {
    if (relative & mask) {
      detail::recv(comm, (relative - mask + root) % n, tag, data);
      break;
    }
    mask <<= 1;
  }
  std::vector<typename Tr::request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (relative + mask < n)
      sends.push_back(comm.transport().async_send((relative + mask + root) % n, tag, std::as_bytes(data)));
  const auto until = comm.step_deadline();
  for (auto& s : sends) comm.transport().wait(s, until);
}

}  // namespace gradwire::collective
