// parameter_server, --ps-mode sync and async, with one rank per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_ps.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_ps_sync_tcp(const options& o, const data_set& data) {
  return train<parameter_server<sync_modes>>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
