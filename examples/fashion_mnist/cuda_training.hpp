// The GPU side of fashion_mnist (--device cuda), as main.cpp sees it: plain types only, no CUDA headers
// (a transport crosses over as gradwire::transport::any_transport, built by main.cpp's compiler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <gradwire/transport/any.hpp>
#include <string>
#include <vector>

namespace fashion_mnist {

struct cuda_run {
  std::string strategy;  // one_device, mirrored, multi_worker_mirrored or central_storage
  // Set for one replica per process: joins the job (TCP or UCX); empty: replicas as threads.
  std::function<gradwire::transport::any_transport()> join;
  int local_rank = 0;  // with join: this process's index on its machine, which picks its GPU
  std::string optimizer;
  int replicas = 1, owner = 0, epochs = 10, batch = 64;
  double lr = 1e-3;
  bool cosine = true;
  std::uint64_t seed = 1;
  double target_accuracy = 0.88;
  // The data set, column-major: image j is images[j * pixels, (j + 1) * pixels).
  std::size_t pixels = 784, classes = 10, train_count = 0, test_count = 0;
  const float* train_images = nullptr;
  const int* train_labels = nullptr;
  const float* test_images = nullptr;
  const int* test_labels = nullptr;
  // The initial parameters W1, b1, W2, b2, W3, b3 (column-major, as mlp<float> makes them),
  // their rows and columns (Eigen's: a bias is rows x 1) and their gradwire shapes
  // (row-major: a weight's is cols x rows, mlp::view).
  std::vector<std::vector<float>> initial;
  std::vector<std::size_t> rows, cols;
  std::vector<gradwire::shape> shapes;
};

struct cuda_result {
  bool chief = false;  // this process ran rank 0, which fills the rest
  double final_accuracy = 0, total_seconds = 0, seconds_reached = 0;
  int epoch_reached = 0;
};

// Trains on the GPU (train_cuda.cu, built with gradwire::cuda); throws gradwire::error
// (errc::device) when there is no GPU.
cuda_result train_on_cuda(const cuda_run& run);

}  // namespace fashion_mnist
