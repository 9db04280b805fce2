// Umbrella header for device support (nvcc only): device tensors, CUDA kernels, the optimizers' device
// paths and the strategy's device replica (every strategy then takes cuda_tensor).
#pragma once

#include "cuda/device_replica.cuh"
#include "cuda/element.cuh"
#include "cuda/runtime.cuh"
#include "gradwire.hpp"
#include "kernels/cuda.cuh"
#include "optim/cuda.cuh"
#include "tensor/cuda_tensor.cuh"
