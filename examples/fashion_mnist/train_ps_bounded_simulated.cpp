// parameter_server, --ps-mode bounded:1, 2 and 4, with ranks as threads in virtual time (--transport simulated).
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_bounded_simulated(const options& o, const data_set& data) {
  return train<parameter_server<bounded_modes>>(o, data, on_simulator{});
}
