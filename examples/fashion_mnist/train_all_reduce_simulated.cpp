// mirrored: the all-reduce strategy with ranks as threads in virtual time (--transport simulated).
#include "family_all_reduce.hpp"

fashion_mnist::summary fashion_mnist::train_all_reduce_simulated(const options& o, const data_set& data) {
  return train<all_reduce>(o, data, on_simulator{});
}
