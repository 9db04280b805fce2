// parameter_server, --ps-mode bounded:1, 2 and 4, with replicas and servers as threads of this process.
#include "family_ps.hpp"

fashion_mnist::summary fashion_mnist::train_ps_bounded_inproc(const options& o, const data_set& data) {
  return train<parameter_server<bounded_modes>>(o, data, on_threads{});
}
