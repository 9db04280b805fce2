// central_storage with one replica per process, over UCX (gradwire::ucx).
#include <gradwire/ucx.hpp>

#include "family_central.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_central_ucx(const options& o, const data_set& data) {
  return train<central>(o, data, one_per_process{[] { return gradwire::cluster::join_ucx(); }});
}
