// Compiled by ctest with nvcc -DCASE=N (CUDA builds only): what CUDA tensors refuse at
// compile time, each with gradwire's readable message. CASE=0 is the control that must compile.
// No runtime assertions here: the assertion is expect_compile_error.cmake, which fails the
// test when a case compiles or fails without its expected message (CMakeLists.txt lists them).
#include <gradwire/cuda.cuh>

#include "helpers/plain_sgd.hpp"

#include <span>
#include <vector>

namespace gw = gradwire;

// An optimizer with a host step only (no optim::device_state, init_device, step_device).
using host_only_sgd = gradwire::test::plain_sgd;

using device_strategy = gw::one_device<gw::cuda_tensor<float>, gw::optim::sgd>;

void use(device_strategy& s, std::vector<gw::cuda_tensor<float>>& device_grads,
         std::vector<gw::host_tensor<float>>& host_grads) {
#if CASE == 0
  s.step(device_grads);  // the control: a CUDA strategy steps with CUDA gradients
  gw::one_device<gw::host_tensor<float>, host_only_sgd> host_strategy(std::vector<gw::host_tensor<float>>{});
  host_strategy.step(host_grads);  // and host_only_sgd is a valid optimizer for host tensors
#elif CASE == 1
  auto step = s.begin_step();  // the incremental step: host tensors only for now
#elif CASE == 2
  gw::cuda_tensor<int> t(gw::shape{4});  // no device element type
#elif CASE == 3
  s.step(host_grads);  // host gradients for device parameters
#elif CASE == 4
  gw::one_device<gw::cuda_tensor<float>, host_only_sgd> t(std::vector<gw::cuda_tensor<float>>{});
  t.step(device_grads);  // an optimizer with no device path
#endif
  (void)s, (void)device_grads, (void)host_grads;
}
