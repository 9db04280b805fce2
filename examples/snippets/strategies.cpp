// docs/strategies/README.md's code: the constructor every strategy shares.
//
// gradwire::docs::strategy declares the constructor as the page shows it and forwards it to
// gradwire::strategy's, so the page's signature compiles against the real one, defaults
// included; main builds both with 2 and with 5 arguments and checks the step they take.
#include <gradwire/gradwire.hpp>

#include <random>
#include <utility>
#include <vector>

#include "snippet_support.hpp"

namespace gradwire::docs {

template <class Tensor, class Optimizer, class Aggregation, class Transport>
class strategy : public gradwire::strategy<Tensor, Optimizer, Aggregation, Transport> {
 public:
  // [docs:constructor]
  strategy(Transport transport, std::vector<Tensor> parameters, Optimizer optimizer = Optimizer(),
           Aggregation aggregation = Aggregation(), collective::communicator_options options = {});
  // [/docs:constructor]
};

template <class Tensor, class Optimizer, class Aggregation, class Transport>
strategy<Tensor, Optimizer, Aggregation, Transport>::strategy(Transport transport, std::vector<Tensor> parameters,
                                                              Optimizer optimizer, Aggregation aggregation,
                                                              collective::communicator_options options)
    : gradwire::strategy<Tensor, Optimizer, Aggregation, Transport>(std::move(transport), std::move(parameters),
                                                                    std::move(optimizer), std::move(aggregation),
                                                                    options) {}

}  // namespace gradwire::docs

namespace gw = gradwire;

int main() {
  const unsigned seed = std::random_device{}();
  constexpr int replicas = 3;
  const auto global = snippets::make_batches(snippets::Model::shape, 1, replicas * 2, seed);
  const auto start = snippets::Model::initial_values(seed);
  // One SGD step on the mean gradient, from rank 0's parameters (the constructor broadcasts them).
  const auto want = snippets::reference_training(snippets::Model::shape, start, global, snippets::reference_sgd{0.01});
  for (bool all_arguments : {false, true}) {
    std::vector<std::vector<double>> results(replicas);
    gw::transport::run_inproc(replicas, [&](gw::transport::inproc endpoint) {
      const int rank = endpoint.rank();
      std::vector<gw::host_tensor<double>> params;
      params.emplace_back(gw::shape{snippets::Model::shape.outputs, snippets::Model::shape.inputs});
      params.emplace_back(gw::shape{snippets::Model::shape.outputs});
      for (std::size_t i = 0; i < start.size(); ++i)  // replicas start apart; rank 0's values win
        (i < params[0].size() ? params[0][i] : params[1][i - params[0].size()]) = start[i] + rank;
      using S = gw::docs::strategy<gw::host_tensor<double>, gw::optim::sgd, gw::aggregation::all_reduce,
                                   gw::transport::inproc>;
      S strategy = all_arguments ? S(endpoint, std::move(params), gw::optim::sgd({.lr = 0.01}),
                                     gw::aggregation::all_reduce(), gw::collective::communicator_options{})
                                 : S(endpoint, std::move(params));  // sgd's default lr is 0.01
      const auto shard = snippets::shard(snippets::Model::shape, global, rank, replicas);
      std::vector<double> values;
      for (auto& p : strategy.parameters()) values.insert(values.end(), p.data(), p.data() + p.size());
      const auto g = snippets::gradient(snippets::Model::shape, std::span<const double>(values), shard[0]);
      const auto weights = g.begin() + std::ptrdiff_t(snippets::Model::shape.weights());
      strategy.step(std::vector<std::vector<double>>{{g.begin(), weights}, {weights, g.end()}});
      values.clear();
      for (auto& p : strategy.parameters()) values.insert(values.end(), p.data(), p.data() + p.size());
      results[std::size_t(rank)] = values;
    });
    for (const auto& got : results)
      snippets::expect_close(std::string("constructor with ") + (all_arguments ? "5" : "2") +
                                 " arguments: the mean-gradient step from rank 0's parameters",
                             std::span<const double>(got), std::span<const double>(want), 1e-12);
  }
  return snippets::report("snippet strategies", seed);
}
