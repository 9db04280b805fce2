// The Fashion-MNIST example's GPU model (mlp_cuda.cuh: cuBLAS + kernels) against its host model (Eigen):
// the same loss and gradients on random batches, and correct-prediction counts that agree.
#include "mlp_cuda.cuh"

#include <cmath>
#include <random>
#include <vector>

#include "mlp_reference.hpp"
#include "helpers/reference.hpp"

namespace gw = gradwire;

TEST_CASE("mlp_cuda's loss and gradients equal the host MLP's", "[cuda][example]") {
  GRADWIRE_TEST_RNG(rng);
  const int batch = GENERATE(1, 7, 64);
  CAPTURE(batch);
  const auto model = gw::test::make_mlp(33, 17, 9, 5, rng.integer<std::uint64_t>(1, 1000));
  std::vector<float> x(33 * std::size_t(batch));
  std::vector<int> labels(static_cast<std::size_t>(batch));
  for (auto& v : x) v = static_cast<float>(rng.uniform(0, 1));
  for (auto& y : labels) y = rng.integer<int>(0, 4);
  const auto want = gw::test::mlp_loss_and_gradients(model, x, labels);

  gw::cuda::stream stream;
  std::vector<gw::cuda_tensor<float>> params;
  for (std::size_t i = 0; i < model.parameters.size(); ++i)
    params.emplace_back(gw::shape{model.rows[i], model.cols[i]}, model.parameters[i], stream);
  const gw::cuda_tensor<float> images(gw::shape{x.size()}, x, stream);
  gw::cuda::device_buffer<int> device_labels(stream), order(stream);
  device_labels.reserve_discard(labels.size());
  order.reserve_discard(labels.size());
  std::vector<int> identity(labels.size());
  for (std::size_t i = 0; i < identity.size(); ++i) identity[i] = int(i);
  // On the stream the buffers were allocated on (stream-ordered memory).
  gw::cuda::check(cudaMemcpyAsync(device_labels.data(), labels.data(), labels.size() * sizeof(int),
                                  cudaMemcpyHostToDevice, stream),
                  "labels to the device");
  gw::cuda::check(cudaMemcpyAsync(order.data(), identity.data(), identity.size() * sizeof(int), cudaMemcpyHostToDevice,
                                  stream),
                  "order to the device");
  stream.synchronize();

  fashion_mnist::mlp_cuda net(model.rows, model.cols, batch, stream);
  net.load_batch(images.data(), device_labels.data(), order.data(), 0, batch);
  const float loss = net.loss_and_gradient(params, batch);
  REQUIRE(loss == Approx(want.loss).epsilon(1e-5));
  for (std::size_t i = 0; i < want.gradients.size(); ++i) {
    CAPTURE(i);
    std::vector<float> got(want.gradients[i].size());
    net.gradients()[i].copy_to_host(got);
    double scale = 0;
    for (float g : want.gradients[i]) scale = std::max(scale, std::abs(double(g)));
    for (std::size_t k = 0; k < got.size(); ++k) {
      CAPTURE(k);
      REQUIRE(double(got[k]) == Approx(double(want.gradients[i][k])).epsilon(1e-4).margin(1e-5 * scale));
    }
  }
  // The same predictions as the host model's arg-max (random data makes ties improbable).
  const std::size_t correct = net.count_correct(params, images.data(), device_labels.data(), labels.size());
  REQUIRE(correct == gw::test::mlp_count_correct(model, x, labels));
}
