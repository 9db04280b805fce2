// Trains through the installed package: a two-replica mirrored step (the core), and with the
// components it was configured with, a one-process multi_worker_mirrored job over TCP (asio),
// the UCX and MPI transports' concepts (ucx, mpi) and a CUDA translation unit (cuda, compiled variants).
#include <cstdio>
#include <gradwire/gradwire.hpp>
#include <vector>
#if CONSUMER_WITH_ASIO
#include <gradwire/asio.hpp>
#endif
#if CONSUMER_WITH_UCX
#include <gradwire/ucx.hpp>
static_assert(gradwire::concepts::one_sided_transport<gradwire::transport::ucx>);
#endif
#if CONSUMER_WITH_MPI
#include <gradwire/mpi.hpp>
static_assert(gradwire::concepts::failable_transport<gradwire::transport::mpi>);
#endif
#if CONSUMER_WITH_CUDA_PART
int consumer_cuda_devices();  // cuda_part.cu
#endif

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
  std::printf("consumer: mirrored %g %g\n", results[0], results[1]);
  if (results[0] != -1.5f || results[1] != -1.5f) return 1;  // mean of 1 and 2, one SGD step
#if CONSUMER_WITH_ASIO
  {  // a job of one process (no launcher environment): joins, steps, and leaves
    std::vector<gradwire::host_tensor<float>> params;
    params.emplace_back(gradwire::shape{1});
    gradwire::multi_worker_mirrored<gradwire::host_tensor<float>, gradwire::optim::sgd> s(
        gradwire::cluster::join_tcp(), std::move(params), gradwire::optim::sgd({.lr = 0.5}));
    std::vector<std::vector<float>> grads{{4.0f}};
    s.step(grads);
    std::printf("consumer: multi_worker_mirrored over TCP, 1 process: %g\n", s.parameters()[0][0]);
    if (s.parameters()[0][0] != -2.0f) return 1;
  }
#endif
#if CONSUMER_WITH_CUDA_PART
  std::printf("consumer: gradwire::cuda compiled; %d CUDA device(s) here\n", consumer_cuda_devices());
#endif
  return 0;
}
