// mirrored: the all-reduce strategy with replicas as threads of this process.
#include "family_all_reduce.hpp"

fashion_mnist::summary fashion_mnist::train_all_reduce_inproc(const options& o, const data_set& data) {
  return train<all_reduce>(o, data, on_threads{});
}
