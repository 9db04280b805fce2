// multi_worker_mirrored: the all-reduce strategy with one replica per process, over TCP (gradwire::asio).
#include <gradwire/asio.hpp>

#include "family_all_reduce.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_all_reduce_tcp(const options& o, const data_set& data) {
  return train<all_reduce>(o, data, one_per_process{[] { return gradwire::cluster::join_tcp(); }});
}
