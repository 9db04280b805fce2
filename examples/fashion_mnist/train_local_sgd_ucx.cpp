// local_sgd with one replica per process, over UCX (gradwire::ucx).
#include <gradwire/ucx.hpp>

#include "family_local_sgd.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_local_sgd_ucx(const options& o, const data_set& data) {
  return train<local_sgd>(o, data, one_per_process{[] { return gradwire::cluster::join_ucx(); }});
}
