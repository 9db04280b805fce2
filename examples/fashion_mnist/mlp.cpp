// The model's products, compiled once for every trainer (train_loop.hpp declares them extern).
#include "mlp.hpp"

template class fashion_mnist::mlp<float>;
