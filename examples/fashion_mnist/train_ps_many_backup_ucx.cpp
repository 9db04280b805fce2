// parameter_server, --ps-mode backup:4 and 8, with one rank per process, over UCX (gradwire::ucx).
#include <gradwire/ucx.hpp>

#include "family_ps.hpp"
#include "one_per_process.hpp"

fashion_mnist::summary fashion_mnist::train_ps_many_backup_ucx(const options& o, const data_set& data) {
  return train<parameter_server<many_backup_modes>>(o, data,
                                                    one_per_process{[] { return gradwire::cluster::join_ucx(); }});
}
