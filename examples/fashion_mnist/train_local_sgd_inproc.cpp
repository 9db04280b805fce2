// local_sgd with replicas as threads of this process.
#include "family_local_sgd.hpp"

fashion_mnist::summary fashion_mnist::train_local_sgd_inproc(const options& o, const data_set& data) {
  return train<local_sgd>(o, data, on_threads{});
}
