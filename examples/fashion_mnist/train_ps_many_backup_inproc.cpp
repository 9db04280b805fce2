// parameter_server, --ps-mode backup:4 and 8, with replicas and servers as threads of this process.
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_many_backup_inproc(const options& o, const data_set& data) {
  return train<parameter_server<many_backup_modes>>(o, data, on_threads{});
}
