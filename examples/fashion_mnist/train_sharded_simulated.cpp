// Sharded (ZeRO-1) with ranks as threads in virtual time (--transport simulated).
#include "family_sharded.hpp"

fashion_mnist::summary fashion_mnist::train_sharded_simulated(const options& o, const data_set& data) {
  return train<sharded>(o, data, on_simulator{});
}
