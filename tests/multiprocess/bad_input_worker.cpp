// A rank of a job that gets bad input over a network transport: a model that differs between ranks, a NaN gradient.
//   bad_input_worker model|nan    (started by scripts/gradwire-run; tests/multiprocess/test_bad_input.py)
// Prints "ERROR <kind>: <message>" for the error it gets, or "OK" when none.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#if defined(GRADWIRE_TEST_UCX)
#include <gradwire/ucx.hpp>
#define GRADWIRE_TEST_JOIN gradwire::cluster::join_ucx
#else
#include <gradwire/asio.hpp>
#define GRADWIRE_TEST_JOIN gradwire::cluster::join_tcp
#endif
#include <gradwire/gradwire.hpp>

namespace gw = gradwire;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto t = GRADWIRE_TEST_JOIN();
    const int me = t.rank();
    gw::collective::communicator_options o;
    o.timeout = std::chrono::seconds(20);  // a hang becomes a timeout, which the test refuses
    // model: rank 1 builds 1000 elements where the others build 1001.
    const std::size_t n = mode == "model" && me == 1 ? 1000 : 1001;
    std::vector<gw::host_tensor<float>> params;
    params.emplace_back(gw::shape{n});
    params.emplace_back(gw::shape{4, 4});
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, decltype(t)> s(
        std::move(t), std::move(params), gw::optim::sgd({.lr = 0.1}), gw::aggregation::all_reduce(), o);
    s.check_finite_gradients(true);
    std::vector<std::vector<float>> grads{std::vector<float>(n, 0.5f), std::vector<float>(16, 0.25f)};
    for (int step = 0; step < 3; ++step) {
      if (mode == "nan" && me == 1 && step == 1) grads[0][123] = std::nanf("");
      s.step(grads);
    }
    std::printf("OK\n");
  } catch (const gw::error& e) {
    std::printf("ERROR %s: %s\n", gw::error_category().message(static_cast<int>(e.kind())).c_str(), e.details().c_str());
  }
  return 0;
}
