// The compressed all-reduce (--compress) with replicas as threads of this process.
#include "family_compressed.hpp"

fashion_mnist::summary fashion_mnist::train_compressed_inproc(const options& o, const data_set& data) {
  return train<compressed>(o, data, on_threads{});
}
