// All-reduce of device memory: directly between GPUs' memory when the ranks share an address
// space, else staged through pinned host chunks with the copies overlapping the transfers.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../cuda/runtime.cuh"
#include "../error.hpp"
#include "../kernels/cuda.cuh"
#include "all_reduce.hpp"
#include "barrier.hpp"
#include "communicator.hpp"
#include "verify.hpp"

namespace gradwire::collective {

// Reusable memory for device all-reduces: two pinned chunks for the staged path.
struct device_staging {
  // Bytes per staged chunk: large enough that each chunk's all-reduce runs at full
  // bandwidth, small enough that copying chunk k+1 down hides behind reducing chunk k.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  std::array<cuda::pinned_buffer<std::byte>, 2> chunks;
  std::array<cuda::event, 2> copied_down;
};

namespace detail {

// Ranks in one process (threads): every rank reduces its 1/N of the buffer reading all
// ranks' device memory at once (one k-input kernel, peer access across devices), then
// copies the other ranks' reduced parts from them. Three exchanges order it: pointers,
// reduced, copied (nobody reuses its buffer while another still reads it).
template <class Tr, class V>
void direct_device_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op, cudaStream_t stream) {
  const int n = comm.size(), me = comm.rank();
  const int device = cuda::current_device();
  // Everything this rank's stream did to `data` is done before others read it.
  cuda::check(cudaStreamSynchronize(stream), "device all-reduce: cudaStreamSynchronize");
  const std::array<std::uint64_t, 3> mine{reinterpret_cast<std::uint64_t>(data.data()),
                                          static_cast<std::uint64_t>(device), data.size()};
  // {address, device, count} of every rank, straight over the transport: words, not data.
  std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(n));
  std::copy(mine.begin(), mine.end(), all.begin() + 3 * me);
  {
    auto& t = comm.transport();
    const auto tag = make_tag(comm.begin_operation(), 0);
    std::vector<typename Tr::request> pending;
    for (int r = 0; r < n; ++r)
      if (r != me)
        pending.push_back(t.async_recv(r, tag, std::as_writable_bytes(std::span(all).subspan(3 * std::size_t(r), 3))));
    for (int r = 0; r < n; ++r)
      if (r != me) pending.push_back(t.async_send(r, tag, std::as_bytes(std::span(mine))));
    const auto until = comm.step_deadline();
    for (auto& p : pending) t.wait(p, until);
  }
  std::vector<const V*> buffers(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::size_t i = 3 * static_cast<std::size_t>(r);
    if (all[i + 2] != data.size())
      throw error(errc::mismatch, "device all_reduce: rank " + std::to_string(r) + " passed " +
                                      std::to_string(all[i + 2]) + " elements, rank " + std::to_string(me) + " " +
                                      std::to_string(data.size()));
    buffers[static_cast<std::size_t>(r)] = reinterpret_cast<const V*>(all[i]);
    const int theirs = static_cast<int>(all[i + 1]);
    if (theirs != device) {
      int can = 0;
      cuda::check(cudaDeviceCanAccessPeer(&can, device, theirs), "cudaDeviceCanAccessPeer");
      if (!can)
        throw error(errc::config, "device all_reduce: device " + std::to_string(device) + " cannot access device " +
                                      std::to_string(theirs) + " directly (no peer access)");
      // cudaMalloc memory needs peer access, stream-ordered (pool) memory its pool's access.
      const cudaError_t status = cudaDeviceEnablePeerAccess(theirs, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
      else
        cuda::check(status, "cudaDeviceEnablePeerAccess");
      cudaMemPool_t pool = nullptr;
      cuda::check(cudaDeviceGetDefaultMemPool(&pool, theirs), "cudaDeviceGetDefaultMemPool");
      cudaMemAccessDesc access{};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = device;
      access.flags = cudaMemAccessFlagsProtReadWrite;
      cuda::check(cudaMemPoolSetAccess(pool, &access, 1), "cudaMemPoolSetAccess");
    }
  }
  // Rank r reduces elements [part(r), part(r + 1)).
  auto part = [&](int r) { return data.size() * static_cast<std::size_t>(r) / static_cast<std::size_t>(n); };
  // This rank's part, with its own buffer first: the sum lands there in place.
  const std::size_t begin = part(me), end = part(me + 1);
  std::vector<const V*> inputs;
  inputs.push_back(data.data() + begin);
  for (int r = 0; r < n; ++r)
    if (r != me) inputs.push_back(buffers[static_cast<std::size_t>(r)] + begin);
  const auto alpha = op == reduce_op::average ? cuda::compute_t<V>(1) / cuda::compute_t<V>(n) : cuda::compute_t<V>(1);
  kernels::cuda::sum<V>(inputs, data.data() + begin, end - begin, alpha, stream);
  cuda::check(cudaStreamSynchronize(stream), "device all-reduce: cudaStreamSynchronize");
  barrier(comm);  // every part is reduced
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const std::size_t b = part(r), e = part(r + 1);
    if (e > b)
      cuda::check(cudaMemcpyAsync(data.data() + b, buffers[static_cast<std::size_t>(r)] + b, (e - b) * sizeof(V),
                                  cudaMemcpyDefault, stream),
                  "device all-reduce: copying a reduced part");
  }
  cuda::check(cudaStreamSynchronize(stream), "device all-reduce: cudaStreamSynchronize");
  barrier(comm);  // nobody reads another's buffer any more
}

// Ranks in other processes: chunk by chunk through two pinned buffers. Chunk k+1 is
// copied down while chunk k is all-reduced on the host, and chunk k goes back up while
// chunk k+1 is reduced; the stream orders every reuse of a buffer after its last copy.
template <class Tr, class V>
void staged_device_all_reduce(communicator<Tr>& comm, std::span<V> data, reduce_op op, cudaStream_t stream,
                              device_staging& staging) {
  const std::size_t per_chunk = std::max<std::size_t>(1, staging.chunk_bytes / sizeof(V));
  for (auto& c : staging.chunks) c.reserve_discard(per_chunk * sizeof(V));
  const std::size_t chunks = data.empty() ? 1 : (data.size() + per_chunk - 1) / per_chunk;
  auto range = [&](std::size_t k) {
    const std::size_t begin = std::min(data.size(), k * per_chunk);
    return std::pair{begin, std::min(data.size(), begin + per_chunk)};
  };
  auto host = [&](std::size_t k) {
    const auto [b, e] = range(k);
    return std::span<V>(reinterpret_cast<V*>(staging.chunks[k % 2].data()), e - b);
  };
  auto copy_down = [&](std::size_t k) {
    const auto [b, e] = range(k);
    if (e > b)
      cuda::check(cudaMemcpyAsync(host(k).data(), data.data() + b, (e - b) * sizeof(V), cudaMemcpyDeviceToHost, stream),
                  "staged all-reduce: copy to the host");
    staging.copied_down[k % 2].record(stream);
  };
  copy_down(0);
  for (std::size_t k = 0; k < chunks; ++k) {
    staging.copied_down[k % 2].synchronize();
    if (k + 1 < chunks) copy_down(k + 1);  // behind chunk k - 1's copy up on the stream
    // Every chunk is one all-reduce, also an empty one: all ranks make the same calls.
    all_reduce(comm, host(k), op);
    const auto [b, e] = range(k);
    if (e > b)
      cuda::check(cudaMemcpyAsync(data.data() + b, host(k).data(), (e - b) * sizeof(V), cudaMemcpyHostToDevice, stream),
                  "staged all-reduce: copy to the device");
  }
  cuda::check(cudaStreamSynchronize(stream), "staged all-reduce: cudaStreamSynchronize");
}

}  // namespace detail

// Sums (or averages) `data`, device memory of this rank, across the communicator's ranks;
// every rank passes the same count. Work on `stream` before the call is included, and the
// result is in place when the call returns. Ranks that share an address space (transport
// declares shares_address_space: inproc) reduce directly in device memory; others stage
// through `staging`'s pinned chunks.
template <class Tr, class V>
void device_all_reduce(communicator<Tr>& comm, std::span<V> data, cudaStream_t stream, device_staging& staging,
                       reduce_op op = reduce_op::sum) {
  if (comm.size() == 1) return;  // one rank: the sum and the average are the data
  auto trace = comm.trace("device_all_reduce", data.size_bytes());
  if constexpr (concepts::shared_address_space_transport<Tr>) {
    trace.arg("path", "direct");
    detail::direct_device_all_reduce(comm, data, op, stream);
  } else {
    trace.arg("path", "staged");  // each pinned chunk's host all_reduce nests inside
    detail::staged_device_all_reduce(comm, data, op, stream, staging);
  }
}

}  // namespace gradwire::collective
