// The MLP of mlp.hpp on the GPU: cuBLAS for every product, small kernels for bias, ReLU and softmax.
//
// Same layout as the host model (column-major matrices, samples as columns) and the same
// math, so a device run follows the host run up to float rounding. The parameters belong
// to the strategy (cuda_tensor); the model owns its gradients and per-batch workspace,
// allocated once, and runs everything on one stream.
#pragma once

#include <cublas_v2.h>

#include <gradwire/cuda.cuh>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace fashion_mnist {

inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw gradwire::error(gradwire::errc::device, std::string(what) + ": cuBLAS status " + std::to_string(int(status)));
}

namespace kernels {

// z[:, j] = relu?(z[:, j] + b)
__global__ void add_bias(float* z, const float* b, int rows, int cols, bool relu) {
  const std::size_t n = std::size_t(rows) * cols;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = z[i] + b[i % rows];
    z[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// d = z > 0 ? d : 0 (the gradient through a ReLU whose output was z)
__global__ void relu_backward(float* d, const float* z, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    if (!(z[i] > 0.0f)) d[i] = 0.0f;
}

// One thread per sample: loss[j] = logsumexp(z[:, j]) - z[y_j, j]; then, when `gradient`,
// z[:, j] := (softmax(z[:, j]) - onehot(y_j)) / cols, which is dL/dz of the mean loss.
__global__ void softmax_cross_entropy(float* z, const int* labels, float* loss, int classes, int cols, bool gradient) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float* col = z + std::size_t(j) * classes;
  float top = col[0];
  for (int c = 1; c < classes; ++c) top = fmaxf(top, col[c]);
  float sum = 0;
  for (int c = 0; c < classes; ++c) sum += expf(col[c] - top);
  const int y = labels[j];
  loss[j] = logf(sum) + top - col[y];
  if (!gradient) return;
  const float inv = 1.0f / float(cols);
  for (int c = 0; c < classes; ++c) col[c] = (expf(col[c] - top) / sum - (c == y ? 1.0f : 0.0f)) * inv;
}

// correct += (argmax z[:, j] == y_j), one thread per sample.
__global__ void count_correct(const float* z, const int* labels, int classes, int cols, unsigned* correct) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const float* col = z + std::size_t(j) * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (col[c] > col[best]) best = c;
  if (best == labels[j]) atomicAdd(correct, 1u);
}

// x[:, j] = images[:, order[first + j]], labels likewise: one block per sample.
__global__ void gather_batch(const float* images, const int* labels, const int* order, std::size_t first, int pixels,
                             float* x, int* y) {
  const int j = blockIdx.x;
  const std::size_t sample = std::size_t(order[first + j]);
  for (int p = threadIdx.x; p < pixels; p += blockDim.x) x[std::size_t(j) * pixels + p] = images[sample * pixels + p];
  if (threadIdx.x == 0) y[j] = labels[sample];
}

inline unsigned blocks_for(std::size_t n) { return unsigned(std::min<std::size_t>((n + 255) / 256, 4096)); }

}  // namespace kernels

// One replica's model on the GPU. parameters: W1, b1, W2, b2, W3, b3 on the device.
class mlp_cuda {
 public:
  // rows[i] x cols[i]: the shapes of the six tensors; batch: the largest batch it will see.
  mlp_cuda(std::vector<std::size_t> rows, std::vector<std::size_t> cols, int batch, cudaStream_t stream)
      : rows_(std::move(rows)), cols_(std::move(cols)), batch_(batch), stream_(stream), labels_(stream), correct_(stream) {
    check_cublas(cublasCreate(&blas_), "cublasCreate");
    check_cublas(cublasSetStream(blas_, stream_), "cublasSetStream");
    for (std::size_t i = 0; i < rows_.size(); ++i)
      gradients_.emplace_back(gradwire::shape{rows_[i], cols_[i]}, stream_);
    const std::size_t b = std::size_t(batch);
    z1_ = buffer(hidden1() * b);
    z2_ = buffer(hidden2() * b);
    z3_ = buffer(classes() * b);
    d1_ = buffer(hidden1() * b);
    d2_ = buffer(hidden2() * b);
    x_ = buffer(input() * b);
    loss_ = buffer(b);
    std::vector<float> ones(b, 1.0f);
    ones_ = gradwire::cuda_tensor<float>(gradwire::shape{b}, ones, stream_);
    labels_.reserve_discard(b);
    correct_.reserve_discard(1);
    y_ = labels_.data();
  }
  mlp_cuda(const mlp_cuda&) = delete;
  mlp_cuda& operator=(const mlp_cuda&) = delete;
  ~mlp_cuda() { (void)cublasDestroy(blas_); }

  std::vector<gradwire::cuda_tensor<float>>& gradients() noexcept { return gradients_; }

  // Samples order[first .. first + b) of a data set already on the device, into x and y.
  void load_batch(const float* images, const int* labels, const int* order, std::size_t first, int b) {
    kernels::gather_batch<<<b, 256, 0, stream_>>>(images, labels, order, first, int(input()), x_.data(), y_);
    gradwire::cuda::check(cudaGetLastError(), "gather_batch");
  }

  // Forward and backward over the loaded batch of b samples; returns the mean loss and
  // leaves its gradient in gradients().
  float loss_and_gradient(std::span<const gradwire::cuda_tensor<float>> p, int b) {
    forward(p, x_.data(), b);
    kernels::softmax_cross_entropy<<<(b + 127) / 128, 128, 0, stream_>>>(z3_.data(), y_, loss_.data(), int(classes()),
                                                                          b, true);
    gradwire::cuda::check(cudaGetLastError(), "softmax_cross_entropy");
    backward(p, b);
    std::vector<float> losses(std::size_t(b), 0.0f);
    gradwire::cuda::check(cudaMemcpyAsync(losses.data(), loss_.data(), std::size_t(b) * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_),
                          "loss to the host");
    gradwire::cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    double sum = 0;
    for (float l : losses) sum += l;
    return float(sum / b);
  }

  // Correct predictions over `count` samples of a device data set, in chunks of the batch.
  std::size_t count_correct(std::span<const gradwire::cuda_tensor<float>> p, const float* images, const int* labels,
                            std::size_t count) {
    gradwire::cuda::check(cudaMemsetAsync(correct_.data(), 0, sizeof(unsigned), stream_), "cudaMemsetAsync");
    for (std::size_t begin = 0; begin < count; begin += std::size_t(batch_)) {
      const int b = int(std::min<std::size_t>(std::size_t(batch_), count - begin));
      forward(p, images + begin * input(), b);
      kernels::count_correct<<<(b + 127) / 128, 128, 0, stream_>>>(z3_.data(), labels + begin, int(classes()), b,
                                                                    correct_.data());
      gradwire::cuda::check(cudaGetLastError(), "count_correct");
    }
    unsigned correct = 0;
    gradwire::cuda::check(cudaMemcpyAsync(&correct, correct_.data(), sizeof correct, cudaMemcpyDeviceToHost, stream_),
                          "count to the host");
    gradwire::cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return correct;
  }

 private:
  gradwire::cuda_tensor<float> buffer(std::size_t n) { return gradwire::cuda_tensor<float>(gradwire::shape{n}, stream_); }
  std::size_t input() const { return cols_[0]; }
  std::size_t hidden1() const { return rows_[0]; }
  std::size_t hidden2() const { return rows_[2]; }
  std::size_t classes() const { return rows_[4]; }

  // C (m x n) = op(A) op(B), column-major, leading dimensions from the stored shapes.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k, const float* a,
            std::size_t lda, const float* b, std::size_t ldb, float* c, std::size_t ldc) {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemm(blas_, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &zero, c, int(ldc)),
                 "cublasSgemm");
  }
  // y = A * ones: the row sums of an m x n matrix (bias gradients).
  void row_sums(const float* a, std::size_t m, std::size_t n, float* y) {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemv(blas_, CUBLAS_OP_N, int(m), int(n), &one, a, int(m), ones_.data(), 1, &zero, y, 1),
                 "cublasSgemv");
  }
  void bias(float* z, const float* b, std::size_t rows, int cols, bool relu) {
    kernels::add_bias<<<kernels::blocks_for(rows * std::size_t(cols)), 256, 0, stream_>>>(z, b, int(rows), cols, relu);
    gradwire::cuda::check(cudaGetLastError(), "add_bias");
  }
  void relu_backward(float* d, const float* z, std::size_t n) {
    kernels::relu_backward<<<kernels::blocks_for(n), 256, 0, stream_>>>(d, z, n);
    gradwire::cuda::check(cudaGetLastError(), "relu_backward");
  }

  void forward(std::span<const gradwire::cuda_tensor<float>> p, const float* x, int b) {
    const std::size_t n = std::size_t(b);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, hidden1(), n, input(), p[0].data(), hidden1(), x, input(), z1_.data(), hidden1());
    bias(z1_.data(), p[1].data(), hidden1(), b, true);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, hidden2(), n, hidden1(), p[2].data(), hidden2(), z1_.data(), hidden1(), z2_.data(),
         hidden2());
    bias(z2_.data(), p[3].data(), hidden2(), b, true);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, classes(), n, hidden2(), p[4].data(), classes(), z2_.data(), hidden2(), z3_.data(),
         classes());
    bias(z3_.data(), p[5].data(), classes(), b, false);
  }

  // z3_ holds dL/dz3; as mlp::backward on the host.
  void backward(std::span<const gradwire::cuda_tensor<float>> p, int b) {
    const std::size_t n = std::size_t(b);
    auto& g = gradients_;
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, classes(), hidden2(), n, z3_.data(), classes(), z2_.data(), hidden2(), g[4].data(),
         classes());
    row_sums(z3_.data(), classes(), n, g[5].data());
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, hidden2(), n, classes(), p[4].data(), classes(), z3_.data(), classes(), d2_.data(),
         hidden2());
    relu_backward(d2_.data(), z2_.data(), hidden2() * n);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, hidden2(), hidden1(), n, d2_.data(), hidden2(), z1_.data(), hidden1(), g[2].data(),
         hidden2());
    row_sums(d2_.data(), hidden2(), n, g[3].data());
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, hidden1(), n, hidden2(), p[2].data(), hidden2(), d2_.data(), hidden2(), d1_.data(),
         hidden1());
    relu_backward(d1_.data(), z1_.data(), hidden1() * n);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, hidden1(), input(), n, d1_.data(), hidden1(), x_.data(), input(), g[0].data(),
         hidden1());
    row_sums(d1_.data(), hidden1(), n, g[1].data());
  }

  std::vector<std::size_t> rows_, cols_;
  int batch_;
  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  std::vector<gradwire::cuda_tensor<float>> gradients_;
  gradwire::cuda_tensor<float> z1_, z2_, z3_, d1_, d2_, x_, loss_, ones_;
  gradwire::cuda::device_buffer<int> labels_;
  gradwire::cuda::device_buffer<unsigned> correct_;
  int* y_ = nullptr;  // labels_ of the loaded batch
};

}  // namespace fashion_mnist
