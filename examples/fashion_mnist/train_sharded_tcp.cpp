// sharded (ZeRO-1) with one replica per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_sharded.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_sharded_tcp(const options& o, const data_set& data) {
  return train<sharded>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
