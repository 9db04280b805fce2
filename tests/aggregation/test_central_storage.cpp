// central_storage trains like mirrored (all-reduce), keeps replicas bit-identical, and only the owner applies updates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <gradwire/gradwire.hpp>
#include <random>
#include <span>
#include <vector>

namespace gw = gradwire;

namespace {

// Linear least squares y ~ W x + b: small enough to stay fast, gradients by hand.
constexpr std::size_t in = 5, out = 3, batch = 4;
constexpr int steps = 5;
// Parameter tensors: W (out x in), an empty one (rides along), b (out).
const std::vector<std::size_t> tensor_sizes{out * in, 0, out};

// One rank's samples for one step: x (batch x in), y (batch x out), drawn in double.
struct shard {
  std::vector<double> x, y;
};

std::vector<std::vector<shard>> make_data(int ranks, std::uint64_t seed) {  // [step][rank]
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist;
  std::vector<std::vector<shard>> data(steps, std::vector<shard>(ranks));
  for (auto& step : data)
    for (auto& s : step) {
      s.x.resize(batch * in);
      s.y.resize(batch * out);
      for (auto& v : s.x) v = dist(gen);
      for (auto& v : s.y) v = dist(gen);
    }
  return data;
}

// The starting point every run must end up with; other ranks start elsewhere, so setup
// has to broadcast the owner's parameters.
template <class T>
std::vector<gw::host_tensor<T>> make_params(bool authoritative, int rank) {
  std::vector<gw::host_tensor<T>> params;
  for (std::size_t s : tensor_sizes) params.emplace_back(gw::shape{s});
  for (std::size_t k = 0; k < params.size(); ++k)
    for (std::size_t i = 0; i < params[k].size(); ++i)
      params[k][i] = authoritative ? static_cast<T>(0.1 * std::sin(double(3 * i + k))) : static_cast<T>(100 + rank);
  return params;
}

// Gradient of 1/(2 batch) sum ||W x + b - y||^2 at this replica's parameters.
template <class T>
std::vector<std::vector<T>> gradients(std::span<const gw::host_tensor<T>> p, const shard& s) {
  std::vector<std::vector<T>> g{std::vector<T>(out * in), {}, std::vector<T>(out)};
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      T r = p[2][o] - static_cast<T>(s.y[n * out + o]);
      for (std::size_t i = 0; i < in; ++i) r += p[0][o * in + i] * static_cast<T>(s.x[n * in + i]);
      r /= static_cast<T>(batch);
      for (std::size_t i = 0; i < in; ++i) g[0][o * in + i] += r * static_cast<T>(s.x[n * in + i]);
      g[2][o] += r;
    }
  return g;
}

// Forwards to an optimizer and counts the tensors it updated on this rank.
template <class O>
struct counting {
  O inner;
  int* calls = nullptr;
  template <class T>
  using state = typename O::template state<T>;
  template <class T>
  state<T> init(std::size_t n) const {
    return inner.template init<T>(n);
  }
  template <class T>
  void step(state<T>& s, std::span<T> params, std::span<const T> grads, T grad_scale) const {
    ++*calls;
    inner.step(s, params, grads, grad_scale);
  }
};

// all_reduce (move-only, so built per rank) with the owner argument of central's constructor.
struct mirrored_aggregation : gw::aggregation::all_reduce {
  explicit mirrored_aggregation(int) {}
};

// Trains `steps` steps on `ranks` replicas (Aggregation built from the owner rank); returns every replica's flat parameters
// after every step ([step][rank]) and how many tensor updates each rank applied.
template <class T, class Aggregation, class O>
std::pair<std::vector<std::vector<std::vector<T>>>, std::vector<int>> train(int ranks, int owner, O optimizer,
                                                                             const std::vector<std::vector<shard>>& data) {
  using strategy = gw::strategy<gw::host_tensor<T>, counting<O>, Aggregation, gw::transport::inproc>;
  std::vector<std::vector<std::vector<T>>> history(steps, std::vector<std::vector<T>>(ranks));
  std::vector<int> calls(ranks, 0);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int me = t.rank();
    strategy s(t, make_params<T>(me == owner, me), counting<O>{optimizer, &calls[me]},
               Aggregation(owner));
    for (int k = 0; k < steps; ++k) {
      s.step(gradients<T>(s.parameters(), data[k][me]));
      for (const auto& p : s.parameters()) history[k][me].insert(history[k][me].end(), p.data(), p.data() + p.size());
    }
  });
  return {history, calls};
}

template <class T, class O>
void check_against_mirrored(int ranks, int owner, O optimizer) {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(ranks, owner, seed);
  const auto data = make_data(ranks, seed);
  const auto [central, central_calls] = train<T, gw::aggregation::central>(ranks, owner, optimizer, data);
  const auto [mirrored, mirrored_calls] = train<T, mirrored_aggregation>(ranks, 0, optimizer, data);
  const int tensors = static_cast<int>(tensor_sizes.size());
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(central_calls[r] == (r == owner ? steps * tensors : 0));  // non-owners never apply
    REQUIRE(mirrored_calls[r] == steps * tensors);
  }
  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    for (int r = 1; r < ranks; ++r) REQUIRE(central[k][r] == central[k][0]);  // bit-identical replicas
    // Relative to the parameters' scale (about 0.1-1), so values near zero don't flake.
    const auto& want = mirrored[k][0];
    double scale = 0;
    for (T v : want) scale = std::max(scale, std::abs(double(v)));
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      REQUIRE(double(central[k][0][i]) == Approx(double(want[i])).epsilon(1e-5).margin(1e-5 * scale));
    }
  }
}

}  // namespace

TEST_CASE("central_storage trains like mirrored with SGD and momentum (float) and Adam (double)") {
  const int ranks = GENERATE(2, 3, 4);
  const int owner = GENERATE_COPY(0, ranks - 1);
  check_against_mirrored<float>(ranks, owner, gw::optim::sgd({.lr = 0.1}));
  check_against_mirrored<float>(ranks, owner, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}));
  check_against_mirrored<double>(ranks, owner, gw::optim::adam({.lr = 0.01}));
}

TEST_CASE("central_storage is the strategy alias over aggregation::central and trains on one rank") {
  using s = gw::central_storage<gw::host_tensor<float>, gw::optim::sgd>;
  STATIC_REQUIRE(std::is_same_v<s::aggregation_type, gw::aggregation::central>);
  STATIC_REQUIRE(std::is_same_v<s::transport_type, gw::transport::inproc>);
  STATIC_REQUIRE(gw::concepts::aggregation<gw::aggregation::central, double, gw::transport::inproc>);
  std::vector<float> after;
  gw::transport::run_inproc(1, [&](gw::transport::inproc t) {
    s strategy(t, make_params<float>(true, 0), gw::optim::sgd({.lr = 0.5}));
    strategy.step(std::vector<std::vector<float>>{std::vector<float>(out * in, 1.0f), {}, std::vector<float>(out, 2.0f)});
    after.assign(strategy.parameters()[2].data(), strategy.parameters()[2].data() + out);
  });
  const auto start = make_params<float>(true, 0);
  for (std::size_t o = 0; o < out; ++o) REQUIRE(after[o] == start[2][o] - 1.0f);
}

TEST_CASE("central_storage refuses an owner outside the job on every rank") {
  gw::transport::inproc_group group(2);
  auto raw = group.run([](gw::transport::inproc t) {
    gw::central_storage<gw::host_tensor<float>, gw::optim::sgd> s(t, make_params<float>(true, 0), gw::optim::sgd(),
                                                                 gw::aggregation::central(2));
  });
  for (auto& e : raw) {
    REQUIRE(e);
    REQUIRE_THROWS_MATCHES(std::rethrow_exception(e), gw::error,
                           Catch::Predicate<gw::error>([](const gw::error& x) {
                             return x.kind() == gw::errc::invalid_argument &&
                                    std::string(x.what()).find("owner rank 2 outside 0..1") != std::string::npos;
                           }));
  }
}
