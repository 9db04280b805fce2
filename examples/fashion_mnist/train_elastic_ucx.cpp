// multi_worker_mirrored --min-replicas M: the elastic all-reduce, over UCX (gradwire::ucx).
#include <gradwire/ucx.hpp>

#include "family_elastic.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_elastic_ucx(const options& o, const data_set& data) {
  return train<elastic>(o, data, one_per_process{[] { return gradwire::cluster::join_ucx(); }});
}
