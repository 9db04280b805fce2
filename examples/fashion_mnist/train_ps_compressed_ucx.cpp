// parameter_server --compress CODEC, --ps-mode sync and async, with one rank per process, over UCX (gradwire::ucx):
// pushes put into the servers' windows where UCX prefers one-sided access.
#include <gradwire/ucx.hpp>

#include "family_ps_compressed.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_ps_compressed_ucx(const options& o, const data_set& data) {
  return train<ps_compressed>(o, data, one_per_process{[] { return gradwire::cluster::join_ucx(); }});
}
