// The consumer's CUDA translation unit: gradwire::cuda's headers compile with the consumer's nvcc.
#include <gradwire/cuda.cuh>

static_assert(gradwire::concepts::tensor<gradwire::cuda_tensor<float>>);

// How many CUDA devices this machine has (0 without a GPU or driver: not an error here).
int consumer_cuda_devices() { return gradwire::cuda::device_count(); }
