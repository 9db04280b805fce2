// central_storage with replicas as threads of this process.
#include "family_central.hpp"

fashion_mnist::summary fashion_mnist::train_central_inproc(const options& o, const data_set& data) {
  return train<central>(o, data, on_threads{});
}
