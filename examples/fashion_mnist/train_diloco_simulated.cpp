// diloco with ranks as threads in virtual time (--transport simulated).
#include "family_diloco.hpp"

fashion_mnist::summary fashion_mnist::train_diloco_simulated(const options& o, const data_set& data) {
  return train<diloco>(o, data, on_simulator{});
}
