// Compiled by ctest, not built: the Fashion-MNIST example's model and data loader at -O3 for
// AVX-512 with -Werror. GCC 12 warned here by the hundred, '__Y' may be used uninitialized, from
// its own avx512fintrin.h inlined into Eigen (GCC bug 105593); examples/fashion_mnist/eigen.hpp
// silences that where Eigen is included, and this checks that nothing else warns.
#include "idx.hpp"
#include "mlp.hpp"

template class fashion_mnist::mlp<float>;
template fashion_mnist::fashion_mnist_data<float> fashion_mnist::load_fashion_mnist<float>(const std::filesystem::path&,
                                                                                           bool);
