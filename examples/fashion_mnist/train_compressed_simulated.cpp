// The compressed all-reduce (--compress) with ranks as threads in virtual time (--transport simulated).
#include "family_compressed.hpp"

fashion_mnist::summary fashion_mnist::train_compressed_simulated(const options& o, const data_set& data) {
  return train<compressed>(o, data, on_simulator{});
}
