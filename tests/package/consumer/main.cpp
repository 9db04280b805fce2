// Trains one step of a two-replica mirrored strategy through the installed package.
#include <cstdio>
#include <gradwire/gradwire.hpp>
#include <vector>

// The installed headers carry the concepts, so a consumer's own policies can be checked too.
static_assert(gradwire::concepts::transport<gradwire::transport::inproc>);
static_assert(gradwire::concepts::tensor<gradwire::host_tensor<float>>);

int main() {
  float results[2] = {0, 0};
  gradwire::transport::run_inproc(2, [&](gradwire::transport::inproc endpoint) {
    std::vector<gradwire::host_tensor<float>> params;
    params.emplace_back(gradwire::shape{2});
    gradwire::mirrored<gradwire::host_tensor<float>, gradwire::optim::sgd> s(endpoint, std::move(params),
                                                                             gradwire::optim::sgd({.lr = 1.0}));
    std::vector<std::vector<float>> grads{{float(endpoint.rank() + 1), 0.0f}};
    s.step(grads);
    results[endpoint.rank()] = s.parameters()[0][0];
  });
  std::printf("consumer: %g %g\n", results[0], results[1]);
  return (results[0] == -1.5f && results[1] == -1.5f) ? 0 : 1;  // mean of 1 and 2, one SGD step
}
