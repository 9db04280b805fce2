// Umbrella header for device support (nvcc only): device tensors, the CUDA runtime wrappers and the CUDA kernels.
#pragma once

#include "cuda/element.cuh"
#include "cuda/runtime.cuh"
#include "gradwire.hpp"
#include "kernels/cuda.cuh"
#include "tensor/cuda_tensor.cuh"
