// Host side of the GPU MLP test: the example's Eigen MLP, behind plain types.
#include "mlp_reference.hpp"

#include <algorithm>

#include <catch2/catch.hpp>

#include "mlp.hpp"

namespace gradwire::test {

mlp_shapes make_mlp(std::size_t inputs, std::size_t hidden1, std::size_t hidden2, std::size_t classes,
                    std::uint64_t seed) {
  fashion_mnist::mlp<float> m({Eigen::Index(inputs), Eigen::Index(hidden1), Eigen::Index(hidden2), Eigen::Index(classes)},
                              seed);
  mlp_shapes out;
  for (const auto& p : m.parameter_views()) {
    out.parameters.emplace_back(p.data(), p.data() + p.size());
    const auto [rows, cols] = fashion_mnist::mlp<float>::eigen_extents(p.shape());
    out.rows.push_back(rows);
    out.cols.push_back(cols);
  }
  return out;
}

namespace {
// What the GPU test hands over must describe one model and one batch.
void require_consistent(const mlp_shapes& model, const std::vector<float>& x, const std::vector<int>& labels) {
  REQUIRE(model.parameters.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) REQUIRE(model.parameters[i].size() == model.rows[i] * model.cols[i]);
  REQUIRE(x.size() == model.cols[0] * labels.size());
  for (int y : labels) REQUIRE((y >= 0 && std::size_t(y) < model.rows[4]));
}

fashion_mnist::mlp<float> host_model(const mlp_shapes& model) {
  fashion_mnist::mlp<float> m({Eigen::Index(model.cols[0]), Eigen::Index(model.rows[0]), Eigen::Index(model.rows[2]),
                               Eigen::Index(model.rows[4])});
  auto views = m.parameter_views();
  for (std::size_t i = 0; i < views.size(); ++i) std::copy(model.parameters[i].begin(), model.parameters[i].end(), views[i].data());
  return m;
}
}  // namespace

std::size_t mlp_count_correct(const mlp_shapes& model, const std::vector<float>& x, const std::vector<int>& labels) {
  require_consistent(model, x, labels);
  auto m = host_model(model);
  const Eigen::Map<const fashion_mnist::mlp<float>::matrix> batch(x.data(), Eigen::Index(model.cols[0]),
                                                                  Eigen::Index(labels.size()));
  return m.count_correct(batch, labels);
}

loss_and_gradients mlp_loss_and_gradients(const mlp_shapes& model, const std::vector<float>& x,
                                          const std::vector<int>& labels) {
  require_consistent(model, x, labels);
  auto m = host_model(model);
  const Eigen::Map<const fashion_mnist::mlp<float>::matrix> batch(x.data(), Eigen::Index(model.cols[0]),
                                                                  Eigen::Index(labels.size()));
  loss_and_gradients out;
  out.loss = m.loss_and_gradient(batch, labels);
  for (const auto& g : m.gradient_views()) out.gradients.emplace_back(g.data(), g.data() + g.size());
  return out;
}

}  // namespace gradwire::test
