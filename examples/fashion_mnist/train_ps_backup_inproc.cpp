// parameter_server, --ps-mode backup:1 and 2, with replicas and servers as threads of this process.
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_backup_inproc(const options& o, const data_set& data) {
  return train<parameter_server<backup_modes>>(o, data, on_threads{});
}
