// The all-reduce aggregation's device path: gradients reduced in device memory, the update fused on the device.
#pragma once

#include <cstddef>
#include <span>

#include "../collective/cuda_all_reduce.cuh"
#include "../cuda/runtime.cuh"
#include "all_reduce.hpp"

namespace gradwire::aggregation {

// What the device path keeps across steps: the flat device bucket and the staging chunks.
template <class V>
struct device_workspace {
  cuda::device_buffer<V> flat;
  collective::device_staging staging;
};

// Found by ADL from the strategy's device replica. The replicas' device gradients are
// packed into one flat device buffer on `stream`, summed across ranks in device memory
// (collective::device_all_reduce: directly between threads' buffers, or staged through
// pinned chunks), and apply_device(i, device gradient, 1/N) runs the optimizer's fused
// step on each tensor. Same arithmetic as the host path: sum, then the 1/N in the step.
template <class Algorithm, class Tr, class V, class ApplyDevice>
void device_step(all_reduce_agent<Algorithm, V, Tr>&, collective::communicator<Tr>& comm,
                 std::span<const std::span<const V>> device_grads, ApplyDevice&& apply_device,
                 device_workspace<V>& workspace, cudaStream_t stream) {
  std::size_t total = 0;
  for (auto g : device_grads) total += g.size();
  if (total > workspace.flat.size()) {
    workspace.flat.reserve_discard(total);
    // Allocated in order on the legacy stream; `stream` may not wait for it by itself.
    cuda::check(cudaDeviceSynchronize(), "all_reduce (device): allocating the bucket");
  }
  std::size_t offset = 0;
  for (auto g : device_grads) {
    if (!g.empty())
      cuda::check(cudaMemcpyAsync(workspace.flat.data() + offset, g.data(), g.size_bytes(), cudaMemcpyDeviceToDevice,
                                  stream),
                  "all_reduce (device): packing gradients");
    offset += g.size();
  }
  const std::span<V> flat(workspace.flat.data(), total);
  collective::device_all_reduce(comm, flat, stream, workspace.staging);
  // apply_device runs on the tensors' own streams: the reduced bucket must be complete.
  cuda::check(cudaStreamSynchronize(stream), "all_reduce (device): cudaStreamSynchronize");
  const V scale = V(1) / static_cast<V>(comm.size());
  offset = 0;
  for (std::size_t i = 0; i < device_grads.size(); ++i) {
    apply_device(i, std::span<const V>(flat.data() + offset, device_grads[i].size()), scale);
    offset += device_grads[i].size();
  }
}

}  // namespace gradwire::aggregation
