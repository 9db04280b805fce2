// What the CUDA strategy tests share (test_cuda_strategy*.cu): the two tensor kinds behind
// one interface, a training loop over in-process replicas, and the host-against-CUDA comparison.
#pragma once

#include <gradwire/cuda.cuh>

#include <random>
#include <span>
#include <utility>
#include <vector>

#include "collective/collective_support.hpp"
#include "helpers/close.hpp"
#include "helpers/least_squares.hpp"
#include "helpers/reference.hpp"

// Named, not anonymous: a header's helpers are one set for both translation units.
namespace gradwire::test::cuda_strategy {

using gradwire::test::require_trajectories_close;

namespace gw = gradwire;
using gw::testing::batch_data;

inline const gw::testing::least_squares model{7, 3, 5};  // W: 3 x 7 (21 floats: odd, not a multiple of 4), b: 3

template <class T>
std::vector<T> start_values(int rank, std::size_t n, int salt) {
  std::mt19937 gen(static_cast<unsigned>(1000 * salt + rank));  // differs per rank: setup must make them equal
  std::normal_distribution<double> dist(0.0, 0.5);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// The two tensor kinds behind one interface: make tensors from host values, read them back.
template <class T>
struct host_kind {
  using tensor = gw::host_tensor<T>;
  explicit host_kind(int) {}
  tensor make(std::span<const T> values) {
    tensor t(gw::shape{values.size()});
    std::copy(values.begin(), values.end(), t.data());
    return t;
  }
  std::vector<T> read(const tensor& t) { return {t.data(), t.data() + t.size()}; }
};

template <class T>
struct cuda_kind {
  using tensor = gw::cuda_tensor<T>;
  gw::cuda::stream stream;  // this replica's stream: its tensors, copies and kernels go there
  explicit cuda_kind(int) {}
  tensor make(std::span<const T> values) { return tensor(gw::shape{values.size()}, values, stream); }
  std::vector<T> read(const tensor& t) {
    std::vector<T> v(t.size());
    t.copy_to_host(v);
    return v;
  }
};

template <class Kind>
std::vector<typename Kind::tensor> start_params(Kind& kind, int rank) {
  using T = typename Kind::tensor::value_type;
  std::vector<typename Kind::tensor> p;
  p.push_back(kind.make(start_values<T>(rank, model.outputs * model.inputs, 1)));
  p.push_back(kind.make(start_values<T>(rank, model.outputs, 2)));
  return p;
}

// Runs `steps` steps of strategy S on `ranks` in-process replicas (the last `servers` of
// them serve); returns the chief's flat parameters after every step.
template <template <class> class Kind, class T, class S, class MakeStrategy>
std::vector<std::vector<T>> train(int ranks, const std::vector<std::vector<batch_data>>& data, MakeStrategy make) {
  std::vector<std::vector<T>> history(data.size());
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    Kind<T> kind(me);
    S s = make(t, start_params(kind, me));
    if constexpr (requires { s.serve(); }) {
      if (s.is_server()) {
        s.serve();
        return;
      }
    }
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      const std::vector<T> w = kind.read(p[0]), b = kind.read(p[1]);
      const auto g = model.gradients<T>(w.data(), b.data(), data[k][static_cast<std::size_t>(me)]);
      std::vector<typename Kind<T>::tensor> grads;
      for (const auto& gi : g) grads.push_back(kind.make(gi));
      s.step(grads);
      if (me == 0) {
        std::vector<T> flat = kind.read(s.parameters()[0]);
        const auto bias = kind.read(s.parameters()[1]);
        flat.insert(flat.end(), bias.begin(), bias.end());
        history[k] = flat;
      }
    }
  });
  return history;
}

inline std::vector<std::vector<batch_data>> training_data(int replicas, int steps) {
  std::mt19937 gen(std::random_device{}());
  std::vector<std::vector<batch_data>> data(static_cast<std::size_t>(steps));
  for (auto& step : data)
    for (int r = 0; r < replicas; ++r) step.push_back(model.random_batch(gen));
  return data;
}

// The same strategy over host tensors and over CUDA tensors, compared step by step.
template <template <class, class> class Strategy, class T, class O>
void compare_two_ranks_or_more(int ranks, O opt) {
  const auto data = training_data(ranks, 6);
  auto make = [&](auto& t, auto params) {
    using Tensor = typename decltype(params)::value_type;
    return Strategy<Tensor, O>(t, std::move(params), opt);
  };
  const auto host = train<host_kind, T, Strategy<gw::host_tensor<T>, O>>(ranks, data, make);
  const auto device = train<cuda_kind, T, Strategy<gw::cuda_tensor<T>, O>>(ranks, data, make);
  require_trajectories_close(device, host);
}

template <class Tensor, class O>
using local_sgd_2 = gw::local_sgd<Tensor, O, 2>;
template <class Tensor, class O>
using central = gw::central_storage<Tensor, O>;

}  // namespace gradwire::test::cuda_strategy
