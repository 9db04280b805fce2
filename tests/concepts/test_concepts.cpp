// Concepts accept the library's policies and a user's own, and strategy<> composes them.
#include <catch2/catch.hpp>

#include <cmath>
#include <gradwire/gradwire.hpp>
#include <vector>

namespace gw = gradwire;
namespace concepts = gradwire::concepts;

// --- the library's own policies satisfy their concepts --------------------------------
static_assert(concepts::tensor<gw::host_tensor<float>>);
static_assert(concepts::tensor<gw::host_tensor<double>>);
static_assert(concepts::tensor<gw::tensor_view<float>>);
static_assert(!concepts::tensor<gw::tensor_view<const float>>, "a read-only view cannot hold parameters");
static_assert(!concepts::tensor<std::vector<float>>, "no shape(), no location");
static_assert(concepts::optimizer<gw::optim::sgd, float> && concepts::optimizer<gw::optim::adamw, double>);
static_assert(concepts::transport<gw::transport::inproc> && concepts::transport<gw::transport::local>);
static_assert(concepts::aggregation<gw::aggregation::all_reduce, float, gw::transport::inproc>);
static_assert(concepts::aggregation<gw::aggregation::local, double, gw::transport::local>);
static_assert(!concepts::transport<int>);
static_assert(!concepts::aggregation<int, float, gw::transport::inproc>);
// Topology: inproc tells (its group's hosts), a transport without topology() does not, and
// the aggregation over all_reduce_with<hierarchical> composes like the others.
static_assert(concepts::topology_aware_transport<gw::transport::inproc>);
static_assert(!concepts::topology_aware_transport<gw::transport::local>);
static_assert(concepts::aggregation<gw::aggregation::all_reduce_with<gw::collective::hierarchical>, float,
                                    gw::transport::inproc>);
static_assert(gw::collective::is_all_reduce_algorithm_v<gw::collective::hierarchical>);
// The optional seams whose shipped types live where a static_assert beside them is not this
// test's to add (transport/), or that need two policies at once (an agent and a state).
static_assert(concepts::segmenting_transport<gw::transport::inproc> &&
              !concepts::segmenting_transport<gw::transport::local>);
static_assert(concepts::conditionally_loss_tolerant_transport<
                  gw::transport::basic_any_transport<gw::transport::caps::loss_tolerant>> &&
              !concepts::conditionally_loss_tolerant_transport<gw::transport::inproc>);
// Time (clock.hpp): the wrappers and the communicator pass on what they hold; a transport
// without a time of its own runs on the steady clock.
static_assert(concepts::timed_transport<gw::transport::any_transport> &&
              concepts::timed_transport<gw::collective::communicator<gw::transport::inproc>> &&
              !concepts::timed_transport<gw::transport::inproc> && !concepts::timed_transport<gw::transport::local>);
static_assert(!concepts::clock_source<int>);
static_assert(concepts::state_synchronising_agent<gw::aggregation::averaging_agent<4, float, gw::transport::inproc>,
                                                  float, gw::transport::inproc, gw::optim::adam::state<float>>);
static_assert(!concepts::state_averaging_agent<gw::aggregation::all_reduce::agent<float, gw::transport::inproc>>);
static_assert(concepts::server_choosing_agent<gw::ps::agent<gw::ps::sync, float, gw::transport::inproc>> &&
              !concepts::server_choosing_agent<gw::aggregation::local::agent<float, gw::transport::inproc>>);
static_assert(concepts::buffer_visiting_state<gw::optim::momentum::state<float>> &&
              concepts::buffer_visiting_state<const gw::optim::momentum::state<float>> &&
              !concepts::buffer_visiting_state<float>);

// --- a user's own policies, one of each kind -------------------------------------------

// Tensor: parameters in a std::vector the user owns.
struct vector_tensor {
  using value_type = float;
  static constexpr gw::memory_location location = gw::memory_location::host;
  std::vector<float> values;
  gw::shape extents;
  explicit vector_tensor(std::size_t n) : values(n), extents({n}) {}
  float* data() { return values.data(); }
  std::size_t size() const { return values.size(); }
  const gw::shape& shape() const { return extents; }
};

// Optimizer: sign-SGD, p -= lr * sign(g).
struct sign_sgd {
  double lr = 0.5;
  template <class V>
  struct state {};
  template <class V>
  state<V> init(std::size_t) const {
    return {};
  }
  template <class V>
  void step(state<V>&, std::span<V> p, std::span<const V> g, V scale) const {
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= V(lr) * ((g[i] * scale > 0) - (g[i] * scale < 0));
  }
};

// Transport: wraps another transport and counts the bytes it sends.
template <class Inner>
struct counting_transport {
  using request = typename Inner::request;
  Inner inner;
  std::shared_ptr<std::size_t> bytes_sent = std::make_shared<std::size_t>(0);
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) {
    *bytes_sent += b.size();
    return inner.async_send(peer, tag, b);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) { return inner.async_recv(peer, tag, b); }
  void wait(request& r, gw::deadline until) { inner.wait(r, until); }
};

// Aggregation: all-reduce the gradients, then apply the *sum* (no averaging).
struct summing_all_reduce {
  template <class Tr, class V>
  void setup(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>> params) {
    for (auto p : params) gw::collective::broadcast(comm, p, 0);
  }
  template <class Tr, class V, class Apply>
  void step(gw::collective::communicator<Tr>& comm, std::span<const std::span<V>>,
            std::span<const std::span<const V>> grads, Apply&& apply) {
    scratch.resize(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      scratch[i].assign(grads[i].begin(), grads[i].end());
      gw::collective::all_reduce(comm, std::span<V>(scratch[i]));
      apply(i, std::span<const V>(scratch[i]), V(1));
    }
  }
  std::vector<std::vector<float>> scratch;
};

static_assert(concepts::tensor<vector_tensor>);
static_assert(concepts::optimizer<sign_sgd, float>);
static_assert(concepts::transport<counting_transport<gw::transport::inproc>>);
static_assert(concepts::aggregation<summing_all_reduce, float, counting_transport<gw::transport::inproc>>);

TEST_CASE("user policies of every kind compose in one strategy") {
  using user_strategy = gw::strategy<vector_tensor, sign_sgd, summing_all_reduce, counting_transport<gw::transport::inproc>>;
  static_assert(std::is_same_v<user_strategy::optimizer_type, sign_sgd>);
  constexpr int ranks = 3;
  constexpr std::size_t n = 11;
  std::vector<std::vector<float>> finals(ranks);
  std::vector<std::size_t> sent(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    const int r = endpoint.rank();
    std::vector<vector_tensor> params{vector_tensor(n)};
    for (std::size_t i = 0; i < n; ++i) params[0].values[i] = float(r * 10 + i);  // differ until setup
    counting_transport<gw::transport::inproc> t{endpoint};
    auto counter = t.bytes_sent;
    user_strategy s(t, std::move(params), sign_sgd{0.5});
    // Gradient i on rank r is (i - 5) * (r + 1): the sum's sign is sign(i - 5).
    std::vector<std::vector<float>> grads{std::vector<float>(n)};
    for (std::size_t i = 0; i < n; ++i) grads[0][i] = float((int(i) - 5) * (r + 1));
    s.step(grads);
    finals[r] = s.parameters()[0].values;
    sent[r] = *counter;
  });
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const float expected = float(i) - 0.5f * float((int(i) > 5) - (int(i) < 5));  // rank 0's start, one sign step
      REQUIRE(finals[r][i] == expected);
    }
    REQUIRE(sent[r] > 0);  // the user's transport carried the traffic
  }
}

TEST_CASE("one_device runs a user tensor with a library optimizer") {
  std::vector<vector_tensor> params{vector_tensor(4)};
  params[0].values = {1, 2, 3, 4};
  gw::one_device<vector_tensor, gw::optim::sgd> s(std::move(params), gw::optim::sgd({.lr = 0.25}));
  std::vector<std::vector<float>> grads{{4, 4, -4, 0}};
  s.step(grads);
  REQUIRE(s.parameters()[0].values == std::vector<float>{0, 1, 4, 4});
}
