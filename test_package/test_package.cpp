// Two replicas of a mirrored strategy take one SGD step on different gradients and must
// agree on the mean; with the asio component, the TCP transport's concepts hold too.
#include <cstdio>
#include <gradwire/gradwire.hpp>
#include <vector>
#if WITH_ASIO
#include <gradwire/asio.hpp>
static_assert(gradwire::concepts::multiplexing_transport<gradwire::transport::asio_tcp>);
#endif

int main() {
  float results[2] = {0, 0};
  gradwire::transport::run_inproc(2, [&](gradwire::transport::inproc endpoint) {
    std::vector<gradwire::host_tensor<float>> params;
    params.emplace_back(gradwire::shape{1});
    gradwire::mirrored<gradwire::host_tensor<float>, gradwire::optim::sgd> strategy(
        endpoint, std::move(params), gradwire::optim::sgd({.lr = 1.0}));
    std::vector<std::vector<float>> grads{{float(endpoint.rank() + 1)}};
    strategy.step(grads);
    results[endpoint.rank()] = strategy.parameters()[0][0];
  });
  std::printf("gradwire test_package: mirrored step -> %g %g (want -1.5)\n", results[0], results[1]);
  return results[0] == -1.5f && results[1] == -1.5f ? 0 : 1;
}
