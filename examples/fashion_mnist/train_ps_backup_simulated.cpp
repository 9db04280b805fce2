// parameter_server, --ps-mode backup:1 and 2, with ranks as threads in virtual time (--transport simulated).
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_backup_simulated(const options& o, const data_set& data) {
  return train<parameter_server<backup_modes>>(o, data, on_simulator{});
}
