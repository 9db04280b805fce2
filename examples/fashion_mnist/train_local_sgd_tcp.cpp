// local_sgd with one replica per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_local_sgd.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_local_sgd_tcp(const options& o, const data_set& data) {
  return train<local_sgd>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
