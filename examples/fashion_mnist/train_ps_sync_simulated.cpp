// parameter_server, --ps-mode sync and async, with ranks as threads in virtual time (--transport simulated).
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_sync_simulated(const options& o, const data_set& data) {
  return train<parameter_server<sync_modes>>(o, data, on_simulator{});
}
