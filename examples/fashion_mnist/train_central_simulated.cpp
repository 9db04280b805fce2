// central_storage with ranks as threads in virtual time (--transport simulated).
#include "family_central.hpp"

fashion_mnist::summary fashion_mnist::train_central_simulated(const options& o, const data_set& data) {
  return train<central>(o, data, on_simulator{});
}
