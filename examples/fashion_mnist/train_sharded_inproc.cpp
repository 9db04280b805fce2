// Sharded (ZeRO-1) with replicas as threads of this process.
#include "family_sharded.hpp"

fashion_mnist::summary fashion_mnist::train_sharded_inproc(const options& o, const data_set& data) {
  return train<sharded>(o, data, on_threads{});
}
