// diloco with one replica per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_diloco.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_diloco_tcp(const options& o, const data_set& data) {
  return train<diloco>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
