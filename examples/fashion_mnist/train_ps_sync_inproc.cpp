// parameter_server, --ps-mode sync and async, with replicas and servers as threads of this process.
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_sync_inproc(const options& o, const data_set& data) {
  return train<parameter_server<sync_modes>>(o, data, on_threads{});
}
