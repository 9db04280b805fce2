// parameter_server --compress CODEC, --ps-mode sync and async, with one rank per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_ps_compressed.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_ps_compressed_tcp(const options& o, const data_set& data) {
  return train<ps_compressed>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
