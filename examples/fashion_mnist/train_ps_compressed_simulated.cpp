// parameter_server --compress CODEC, --ps-mode sync and async, with ranks as threads in virtual time (--transport simulated).
#include "family_ps_compressed.hpp"

fashion_mnist::summary fashion_mnist::train_ps_compressed_simulated(const options& o, const data_set& data) {
  return train<ps_compressed>(o, data, on_simulator{});
}
