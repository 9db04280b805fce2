// parameter_server --compress CODEC, --ps-mode sync and async, with workers and servers as threads of this process.
#include "family_ps_compressed.hpp"

fashion_mnist::summary fashion_mnist::train_ps_compressed_inproc(const options& o, const data_set& data) {
  return train<ps_compressed>(o, data, on_threads{});
}
