// local_sgd with ranks as threads in virtual time (--transport simulated).
#include "family_local_sgd.hpp"

fashion_mnist::summary fashion_mnist::train_local_sgd_simulated(const options& o, const data_set& data) {
  return train<local_sgd>(o, data, on_simulator{});
}
