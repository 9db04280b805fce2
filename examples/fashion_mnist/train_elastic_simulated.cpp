// mirrored / multi_worker_mirrored --min-replicas M over --transport simulated: the elastic all-reduce with ranks
// as threads in virtual time (a rank dies at die=RANK@TIME of --cluster).
#include "family_elastic.hpp"

fashion_mnist::summary fashion_mnist::train_elastic_simulated(const options& o, const data_set& data) {
  return train<elastic>(o, data, on_simulator{});
}
