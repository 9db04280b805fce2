// Compiled by ctest with -DCASE=N: each case breaks one policy, and the compiler must
// stop with gradwire's readable message. CASE=0 is the control that must compile.
#include <gradwire/gradwire.hpp>

namespace gw = gradwire;

struct tensor_without_shape {  // CASE 1: no shape()
  using value_type = float;
  static constexpr gw::memory_location location = gw::memory_location::host;
  float* data() { return nullptr; }
  std::size_t size() const { return 0; }
};

struct optimizer_without_init {  // CASE 2: no init<V>(n)
  template <class V>
  struct state {};
  template <class V>
  void step(state<V>&, std::span<V>, std::span<const V>, V) const {}
};

struct transport_without_wait {  // CASE 3: no wait(request, deadline)
  struct request {};
  int rank() const { return 0; }
  int size() const { return 1; }
  request async_send(int, std::uint64_t, std::span<const std::byte>) { return {}; }
  request async_recv(int, std::uint64_t, std::span<std::byte>) { return {}; }
};

struct aggregation_without_step {  // CASE 4: no step(...)
  template <class Tr, class V>
  void setup(gw::collective::communicator<Tr>&, std::span<const std::span<V>>) {}
};

// An aggregation whose step states the callback it takes, as careful user code does:
// (i, grad, scale), what strategy<> hands over, fits; a callback of another shape (CASE 9)
// does not. So the concept's stand-in for the callback must take exactly (i, grad, scale).
template <int Arguments>
struct aggregation_naming_its_callback {
  template <class Tr, class V>
  void setup(gw::collective::communicator<Tr>&, std::span<const std::span<V>>) {}
  template <class Tr, class V, class Apply>
    requires(Arguments == 3 ? std::invocable<Apply&, std::size_t, std::span<const V>, V>
                            : std::invocable<Apply&, std::size_t, std::span<const V>>)
  void step(gw::collective::communicator<Tr>&, std::span<const std::span<V>>, std::span<const std::span<const V>>,
            Apply&&) {}
};

struct ps_mode_without_lead {  // CASE 5: a parameter-server mode without max_lead
  static constexpr const char* name = "mine";
  static constexpr bool on_arrival = true;
  static constexpr int backups = 0;
};

// optim::sgd without set_lr(double) (CASE 10: a learning-rate schedule cannot set its rate).
struct optimizer_without_set_lr {
  static constexpr const char* name = "sgd_without_set_lr";
  template <class V>
  using state = gw::optim::sgd::state<V>;
  template <class V>
  state<V> init(std::size_t n) const {
    return gw::optim::sgd().init<V>(n);
  }
  template <class V>
  void step(state<V>& s, std::span<V> params, std::span<const V> grads, V scale) const {
    gw::optim::sgd().step(s, params, grads, scale);
  }
};
inline constexpr auto schedule = [](std::uint64_t, std::uint64_t applied) { return 1.0 / double(applied + 1); };

struct codec_without_decode_add {  // CASE 12: a parameter server's push codec without decode_add
  static constexpr auto kind = gw::concepts::compression_kind::gathered;
  template <class V>
  struct state {};
  template <class V>
  state<V> init(std::size_t) const {
    return {};
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const {
    return n * sizeof(V);
  }
  template <class V>
  void encode(state<V>&, std::span<const V>, std::span<std::byte>) const {}
  template <class V>
  void decode(std::span<const std::byte>, std::span<V>) const {}
};

#if CASE == 0
using S = gw::one_device<gw::host_tensor<float>, gw::optim::sgd>;
// The control: each broken policy above misses exactly one member, so the concept
// that names it is the one that rejects it.
static_assert(gw::concepts::tensor<gw::host_tensor<float>> && !gw::concepts::tensor<tensor_without_shape>);
static_assert(!gw::concepts::transport<transport_without_wait>);
static_assert(gw::concepts::ps_mode<gw::ps::async> && !gw::concepts::ps_mode<ps_mode_without_lead>);
using T = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, aggregation_naming_its_callback<3>, gw::transport::local>;
static_assert(sizeof(T) > 0);
// Every named strategy (strategies/) is a strategy<> whose policies fit their places.
static_assert(sizeof(gw::mirrored<gw::host_tensor<float>, gw::optim::sgd>) > 0 &&
              sizeof(gw::central_storage<gw::host_tensor<double>, gw::optim::momentum>) > 0 &&
              sizeof(gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, 4>) > 0 &&
              sizeof(gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>) > 0);
// A server runs a schedule with an optimizer that has set_lr, and serves without one
// with an optimizer that has none.
void serve(gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>& s) { s.serve(schedule); }
void serve(gw::parameter_server<gw::host_tensor<float>, optimizer_without_set_lr, gw::ps::async>& s) { s.serve(); }
#elif CASE == 1
using S = gw::strategy<tensor_without_shape, gw::optim::sgd, gw::aggregation::local, gw::transport::local>;
#elif CASE == 2
using S = gw::strategy<gw::host_tensor<float>, optimizer_without_init, gw::aggregation::local, gw::transport::local>;
#elif CASE == 3
using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::local, transport_without_wait>;
#elif CASE == 4
using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, aggregation_without_step, gw::transport::local>;
#elif CASE == 5
using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, ps_mode_without_lead>;
// Policies whose template argument is out of range (docs/errors.md: "compile error").
#elif CASE == 6
using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::bounded_staleness<-1>>;
#elif CASE == 7
using S = gw::local_sgd<gw::host_tensor<float>, gw::optim::sgd, 0>;
#elif CASE == 8
using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::backup_workers<0>>;
#elif CASE == 9
using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, aggregation_naming_its_callback<2>, gw::transport::local>;
#elif CASE == 10
using S = gw::parameter_server<gw::host_tensor<float>, optimizer_without_set_lr, gw::ps::sync>;
void serve(S& s) { s.serve(schedule); }
#elif CASE == 11
// Elastic all-reduce over a transport that cannot go on without a lost peer.
#include <gradwire/aggregation/elastic_all_reduce.hpp>
using S = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::elastic_all_reduce, gw::transport::inproc>;
static_assert(sizeof(S) > 0);
#elif CASE == 12
using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync, gw::transport::inproc,
                               codec_without_decode_add>;
static_assert(sizeof(S) > 0);
#endif

int main() { return sizeof(S) > 0 ? 0 : 1; }
