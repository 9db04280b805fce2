// A three-layer ReLU MLP with softmax cross-entropy, on Eigen, exposing its parameters to gradwire as views.
//
// Samples are columns: a batch is a features x batch matrix, so a run of samples of a
// column-major data set is passed without a copy. Every product is an Eigen GEMM.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <gradwire/tensor/host_tensor.hpp>

#include "eigen.hpp"

namespace fashion_mnist {

// input -> hidden1 (ReLU) -> hidden2 (ReLU) -> classes (softmax).
struct layer_sizes {
  Eigen::Index input = 784;
  Eigen::Index hidden1 = 256;
  Eigen::Index hidden2 = 128;
  Eigen::Index classes = 10;
};

// T: float or double. The model owns its parameters and gradients; parameter_views()
// and gradient_views() alias that storage, so they stay valid while the model lives
// (moving the model keeps them valid too: Eigen moves its heap buffers).
template <class T>
class mlp {
  static_assert(std::is_floating_point_v<T>, "fashion_mnist::mlp<T>: T must be float or double");

 public:
  using scalar = T;
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
  using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using row_vector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

  // Deterministic initialisation from `seed`: He-uniform for the ReLU layers,
  // Glorot-uniform for the output layer, zero biases. Values are drawn in double, so
  // mlp<float> and mlp<double> with one seed start from the same (rounded) weights.
  explicit mlp(layer_sizes sizes = {}, std::uint64_t seed = 1) : sizes_(sizes) {
    if (sizes.input < 1 || sizes.hidden1 < 1 || sizes.hidden2 < 1 || sizes.classes < 2)
      throw std::invalid_argument("mlp: layer sizes must be >= 1 (and >= 2 classes)");
    std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
    init_uniform(w1_, sizes.hidden1, sizes.input, std::sqrt(6.0 / double(sizes.input)), rng);
    init_uniform(w2_, sizes.hidden2, sizes.hidden1, std::sqrt(6.0 / double(sizes.hidden1)), rng);
    init_uniform(w3_, sizes.classes, sizes.hidden2, std::sqrt(6.0 / double(sizes.hidden2 + sizes.classes)), rng);
    b1_ = vector::Zero(sizes.hidden1);
    b2_ = vector::Zero(sizes.hidden2);
    b3_ = vector::Zero(sizes.classes);
    gw1_ = matrix::Zero(w1_.rows(), w1_.cols());
    gw2_ = matrix::Zero(w2_.rows(), w2_.cols());
    gw3_ = matrix::Zero(w3_.rows(), w3_.cols());
    gb1_ = vector::Zero(sizes.hidden1);
    gb2_ = vector::Zero(sizes.hidden2);
    gb3_ = vector::Zero(sizes.classes);
  }

  const layer_sizes& sizes() const noexcept { return sizes_; }
  std::size_t parameter_count() const noexcept {
    return static_cast<std::size_t>(w1_.size() + b1_.size() + w2_.size() + b2_.size() + w3_.size() + b3_.size());
  }

  // Forward and backward over one batch (x: input x B, labels: B entries in
  // [0, classes)). Returns the mean softmax cross-entropy over the batch and leaves
  // the gradient of that mean in the gradient tensors (overwritten, not accumulated).
  T loss_and_gradient(const Eigen::Ref<const matrix>& x, std::span<const int> labels) {
    const T loss = forward_loss(x, labels);
    backward(x, labels);
    return loss;
  }

  // Mean loss only (no gradient).
  T loss(const Eigen::Ref<const matrix>& x, std::span<const int> labels) { return forward_loss(x, labels); }

  // Number of samples of the batch whose arg-max class equals the label.
  std::size_t count_correct(const Eigen::Ref<const matrix>& x, std::span<const int> labels);

  // Fraction classified correctly, evaluated in chunks of `chunk` samples so the
  // activations stay small.
  double accuracy(const Eigen::Ref<const matrix>& x, std::span<const int> labels, Eigen::Index chunk = 1000) {
    if (x.cols() == 0) return 0.0;
    std::size_t correct = 0;
    for (Eigen::Index begin = 0; begin < x.cols(); begin += chunk) {
      const Eigen::Index n = std::min(chunk, x.cols() - begin);
      correct += count_correct(x.middleCols(begin, n), labels.subspan(static_cast<std::size_t>(begin),
                                                                     static_cast<std::size_t>(n)));
    }
    return double(correct) / double(x.cols());
  }

  // Parameters and gradients in one fixed order: W1, b1, W2, b2, W3, b3. Shapes are
  // {rows, cols} of column-major matrices (so element (i, j) is at j * rows + i).
  std::vector<gradwire::tensor_view<T>> parameter_views() {
    return {view(w1_), view(b1_), view(w2_), view(b2_), view(w3_), view(b3_)};
  }
  // A view's shape back to Eigen's rows and columns (view() transposes a matrix's): a bias
  // is rows x 1.
  static std::array<std::size_t, 2> eigen_extents(const gradwire::shape& s) {
    return s.rank() > 1 ? std::array<std::size_t, 2>{s[1], s[0]} : std::array<std::size_t, 2>{s[0], 1};
  }
  std::vector<gradwire::tensor_view<T>> gradient_views() {
    return {view(gw1_), view(gb1_), view(gw2_), view(gb2_), view(gw3_), view(gb3_)};
  }

  // Direct access, for tests and checkpoints.
  matrix& w1() noexcept { return w1_; }
  matrix& w2() noexcept { return w2_; }
  matrix& w3() noexcept { return w3_; }
  vector& b1() noexcept { return b1_; }
  vector& b2() noexcept { return b2_; }
  vector& b3() noexcept { return b3_; }
  const matrix& grad_w1() const noexcept { return gw1_; }
  const matrix& grad_w2() const noexcept { return gw2_; }
  const matrix& grad_w3() const noexcept { return gw3_; }
  const vector& grad_b1() const noexcept { return gb1_; }
  const vector& grad_b2() const noexcept { return gb2_; }
  const vector& grad_b3() const noexcept { return gb3_; }

 private:
  template <class Derived>
  static gradwire::tensor_view<T> view(Eigen::PlainObjectBase<Derived>& m) {
    // gradwire's shapes are row-major (as NumPy's and LibTorch's); Eigen stores a matrix
    // column by column, so its memory is the row-major (cols x rows) matrix, the transpose.
    // Named the other way, a codec that reads a tensor as a matrix (PowerSGD) would see a
    // reshuffle of the weight, not the weight, and lose its low rank.
    return {m.data(), {static_cast<std::size_t>(m.cols()), static_cast<std::size_t>(m.rows())}};
  }
  static gradwire::tensor_view<T> view(vector& v) { return {v.data(), {static_cast<std::size_t>(v.size())}}; }

  static void init_uniform(matrix& w, Eigen::Index rows, Eigen::Index cols, double limit, std::mt19937& rng) {
    std::uniform_real_distribution<double> u(-limit, limit);
    w.resize(rows, cols);
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<T>(u(rng));
  }

  void check_batch(const Eigen::Ref<const matrix>& x, std::span<const int> labels) const {
    if (x.rows() != sizes_.input)
      throw std::invalid_argument("mlp: batch has " + std::to_string(x.rows()) + " features per sample, the model " +
                                  std::to_string(sizes_.input));
    if (static_cast<std::size_t>(x.cols()) != labels.size())
      throw std::invalid_argument("mlp: batch has " + std::to_string(x.cols()) + " samples but " +
                                  std::to_string(labels.size()) + " labels");
    for (int y : labels)
      if (y < 0 || y >= sizes_.classes)
        throw std::invalid_argument("mlp: label " + std::to_string(y) + " outside [0, " +
                                    std::to_string(sizes_.classes) + ")");
  }

  // Activations are kept for backward. The buffers are members: after the first batch
  // of a given size nothing is allocated per step.
  void forward(const Eigen::Ref<const matrix>& x);
  // Leaves softmax probabilities in p_ and returns the mean cross-entropy.
  T forward_loss(const Eigen::Ref<const matrix>& x, std::span<const int> labels);
  // Leaves the gradient of the mean loss in the gradient tensors.
  void backward(const Eigen::Ref<const matrix>& x, std::span<const int> labels);

  layer_sizes sizes_;
  matrix w1_, w2_, w3_, gw1_, gw2_, gw3_;
  vector b1_, b2_, b3_, gb1_, gb2_, gb3_;
  // Per-batch workspace: z1_/z2_ hold the post-ReLU activations, z3_ the logits,
  // p_ the probabilities and then dL/dz3, d2_/d1_ the gradients at the hidden layers.
  matrix z1_, z2_, z3_, p_, d2_, d1_;
  row_vector col_max_, col_sum_;
};

// The products, defined out of the class (not inline) so that a program can compile them
// once: `extern template class mlp<float>;` where it uses the model and
// `template class mlp<float>;` in one translation unit (the example's mlp.cpp).

template <class T>
std::size_t mlp<T>::count_correct(const Eigen::Ref<const matrix>& x, std::span<const int> labels) {
  check_batch(x, labels);
  forward(x);
  std::size_t correct = 0;
  for (Eigen::Index j = 0; j < x.cols(); ++j) {
    Eigen::Index best = 0;
    z3_.col(j).maxCoeff(&best);
    correct += best == labels[static_cast<std::size_t>(j)];
  }
  return correct;
}

template <class T>
void mlp<T>::forward(const Eigen::Ref<const matrix>& x) {
  z1_.noalias() = w1_ * x;
  z1_.colwise() += b1_;
  z1_ = z1_.cwiseMax(T(0));  // post-ReLU activation h1 (z1 > 0 exactly where h1 > 0)
  z2_.noalias() = w2_ * z1_;
  z2_.colwise() += b2_;
  z2_ = z2_.cwiseMax(T(0));
  z3_.noalias() = w3_ * z2_;
  z3_.colwise() += b3_;  // logits
}

// The mean cross-entropy computed as logsumexp(z) - z_y per sample (stable for any logits).
template <class T>
T mlp<T>::forward_loss(const Eigen::Ref<const matrix>& x, std::span<const int> labels) {
  check_batch(x, labels);
  if (x.cols() == 0) throw std::invalid_argument("mlp: empty batch");
  forward(x);
  col_max_ = z3_.colwise().maxCoeff();
  p_ = (z3_.rowwise() - col_max_).array().exp().matrix();
  col_sum_ = p_.colwise().sum();
  p_.array().rowwise() /= col_sum_.array();
  T total = (col_sum_.array().log() + col_max_.array()).sum();
  for (Eigen::Index j = 0; j < x.cols(); ++j) total -= z3_(labels[static_cast<std::size_t>(j)], j);
  return total / T(x.cols());
}

// Gradient of the mean loss: dL/dz3 = (softmax - onehot) / B, then back through the
// layers; ReLU passes the gradient where its output was positive.
template <class T>
void mlp<T>::backward(const Eigen::Ref<const matrix>& x, std::span<const int> labels) {
  const T inv_batch = T(1) / T(x.cols());
  for (Eigen::Index j = 0; j < x.cols(); ++j) p_(labels[static_cast<std::size_t>(j)], j) -= T(1);
  p_ *= inv_batch;  // p_ is now dL/dz3
  gw3_.noalias() = p_ * z2_.transpose();
  gb3_ = p_.rowwise().sum();
  d2_.noalias() = w3_.transpose() * p_;
  d2_ = (z2_.array() > T(0)).select(d2_, T(0));
  gw2_.noalias() = d2_ * z1_.transpose();
  gb2_ = d2_.rowwise().sum();
  d1_.noalias() = w2_.transpose() * d2_;
  d1_ = (z1_.array() > T(0)).select(d1_, T(0));
  gw1_.noalias() = d1_ * x.transpose();
  gb1_ = d1_.rowwise().sum();
}

}  // namespace fashion_mnist
