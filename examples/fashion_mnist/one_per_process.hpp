// The launch of the tcp and ucx trainers: one replica per process, joined to the job the launcher describes.
#pragma once

#include <gradwire/cluster/spec.hpp>

#include "train_loop.hpp"

namespace fashion_mnist {

// Join: joins this process to the job (rank, world size, rendezvous address and token from
// the launcher's environment) and returns its transport, e.g. cluster::join_tcp.
template <class Join>
struct one_per_process {
  Join join;

  // The launcher says which ranks serve (gradwire-run --ps, TF_CONFIG's ps, GRADWIRE_NUM_PS).
  int servers(const options&) const {
    return gradwire::cluster::detect().count(gradwire::cluster::task_type::ps);
  }
  template <class Replica>
  void operator()(const options&, Replica&& replica) const {
    replica(join());
  }
};

}  // namespace fashion_mnist
