// multi_worker_mirrored --min-replicas M: the elastic all-reduce, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_elastic.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_elastic_tcp(const options& o, const data_set& data) {
  return train<elastic>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
