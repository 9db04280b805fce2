// diloco with replicas as threads of this process.
#include "family_diloco.hpp"

fashion_mnist::summary fashion_mnist::train_diloco_inproc(const options& o, const data_set& data) {
  return train<diloco>(o, data, on_threads{});
}
