// A rank of a job that gets bad input over a network transport: a model that differs between ranks, a NaN gradient.
//   bad_input_worker model|nan    (started by scripts/gradwire-run; tests/multiprocess/test_bad_input.py)
// Prints "ERROR <kind>: <message>" for the error it gets, or "OK" when none. The rank checks
// the kind itself (GRADWIRE_WORKER_CHECK): any other outcome prints "CHECK FAILED ..." and
// exits 1, which gradwire-run --keep-going passes on as a failing exit status; the test
// checks the messages.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
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

// GRADWIRE_WORKER_CHECK(property, what): prints the property's text and `what` (evaluated
// only when it fails) and exits 1 when `property` is false.
#define GRADWIRE_WORKER_CHECK(property, what)                                                 \
  do {                                                                                        \
    if (!(property)) {                                                                        \
      std::printf("CHECK FAILED %s: %s\n", #property, std::string(what).c_str());             \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

// The error this rank must get: a model that differs is a mismatch on every rank; the NaN
// (on rank 1) is rank 1's invalid argument, and ends the others' steps as a lost peer.
gw::errc expected_kind(const std::string& mode, int rank) {
  if (mode == "model") return gw::errc::mismatch;
  return rank == 1 ? gw::errc::invalid_argument : gw::errc::peer_lost;
}

std::string kind_name(gw::errc kind) { return gw::error_category().message(static_cast<int>(kind)); }

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  GRADWIRE_WORKER_CHECK(mode == "model" || mode == "nan", "usage: bad_input_worker model|nan");
  int me = -1;
  std::optional<gw::errc> got;
  try {
    auto t = GRADWIRE_TEST_JOIN();
    me = t.rank();
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
    got = e.kind();
    std::printf("ERROR %s: %s\n", kind_name(e.kind()).c_str(), e.details().c_str());
  }
  GRADWIRE_WORKER_CHECK(got.has_value(), "rank " + std::to_string(me) + " got no error from bad input (" + mode + ")");
  GRADWIRE_WORKER_CHECK(*got == expected_kind(mode, me), "rank " + std::to_string(me) + " expected " +
                                                             kind_name(expected_kind(mode, me)) + ", got " +
                                                             kind_name(*got));
  return 0;
}
