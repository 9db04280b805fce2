// A rank of a job that gets bad input over a network transport: a model that differs between ranks, a NaN gradient,
// a rank started with another world size, an unknown GRADWIRE_LOG level, a second job on the first one's MASTER_PORT.
//   bad_input_worker model|nan|log|world-size K|hold FILE|same-port|batch-script
//   (started by scripts/gradwire-run, batch-script alone; tests/multiprocess/test_bad_input.py)
// world-size K: rank 1 joins as if WORLD_SIZE were K. log: an ordinary job (one step),
// for the warning GRADWIRE_LOG=<unknown> gives. hold FILE: joins, prints "JOINED", and
// keeps the job (rank 0: its rendezvous store, on MASTER_PORT) until FILE exists.
// same-port: joins only, as a second job given the held job's MASTER_PORT. batch-script:
// joins, in the environment a Slurm batch script gives a program run there without srun.
// Prints "ERROR <kind>: <message>" for the error it gets, or "OK" when none. The rank checks
// the kind itself (GRADWIRE_WORKER_CHECK): any other outcome prints "CHECK FAILED ..." and
// exits 1, which gradwire-run --keep-going passes on as a failing exit status; the test
// checks the messages.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(GRADWIRE_TEST_UCX)
#include <gradwire/ucx.hpp>
#define GRADWIRE_TEST_JOIN gradwire::cluster::join_ucx
#define GRADWIRE_TEST_OPTIONS gradwire::cluster::ucx_options
#define GRADWIRE_TEST_TRANSPORT gradwire::transport::ucx
#else
#include <gradwire/asio.hpp>
#define GRADWIRE_TEST_JOIN gradwire::cluster::join_tcp
#define GRADWIRE_TEST_OPTIONS gradwire::cluster::tcp_options
#define GRADWIRE_TEST_TRANSPORT gradwire::transport::asio_tcp
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

// The error this rank must get (nullopt: none; any_error: some error, which the test does
// not pin down): a model that differs is a mismatch on every rank; the NaN (on rank 1) is
// rank 1's invalid argument, and ends the others' steps as a lost peer. Another world size
// on rank 1: over UCX every rank compares the size each published with its own, a config
// error on each; over TCP rank 0 refuses rank 1's hello (config on rank 1) and waits for a
// rank 1 that never connects (timeout); rank 2 dials a rank 1 that refuses it or is gone.
constexpr auto any_error = static_cast<gw::errc>(-1);
std::optional<gw::errc> expected_kind(const std::string& mode, int rank) {
  if (mode == "log" || mode == "hold") return std::nullopt;
  // A second job on the first one's port: its rank 0 cannot listen there (config); its
  // rank 1 reaches the first job's store, which refuses its job token (auth).
  if (mode == "same-port") return rank == 0 ? gw::errc::config : gw::errc::auth;
  if (mode == "batch-script") return gw::errc::config;  // at once, from detect(): no rank would ever come
  if (mode == "model") return gw::errc::mismatch;
  if (mode == "world-size") {
#if defined(GRADWIRE_TEST_UCX)
    return gw::errc::config;
#else
    return rank == 1 ? gw::errc::config : rank == 0 ? gw::errc::timeout : any_error;
#endif
  }
  return rank == 1 ? gw::errc::invalid_argument : gw::errc::peer_lost;
}

std::string kind_name(std::optional<gw::errc> kind) {
  if (!kind) return "no error";
  if (*kind == any_error) return "any error";
  return gw::error_category().message(static_cast<int>(*kind));
}

// Joins the job; in world-size mode rank 1 as if WORLD_SIZE were `rank1_size` (as a rank
// on another machine would be: its own LOCAL_WORLD_SIZE agrees, so detect() cannot tell).
auto join(const std::string& mode, int rank1_size) {
  if (mode != "world-size") return GRADWIRE_TEST_JOIN();
  const auto spec = gw::cluster::detect();
  auto o = GRADWIRE_TEST_OPTIONS(spec);
  if (spec.rank == 1) o.size = rank1_size;
  return GRADWIRE_TEST_TRANSPORT(o);
}

#if defined(GRADWIRE_TEST_UCX)
// Over UCX, rank 0 serves the rendezvous store for the world-size mode itself, and keeps it
// until every rank has got its error: a rank that reads a peer's address after rank 0 left
// would get a lost store instead of the check under test. The ranks join with serve_store
// off; the check (transport/ucx/join.ipp) is the same code either way.
struct held_store {
  std::optional<gw::rendezvous::store_server> server;
  gw::transport::ucx_options options;
  int ranks = 0;
  explicit held_store(int rank1_size) {
    const auto spec = gw::cluster::detect();
    ranks = spec.world_size;
    options = gw::cluster::ucx_options(spec);
    options.serve_store = false;
    if (spec.rank == 1) options.size = rank1_size;
    if (spec.rank == 0) server.emplace(options.store_host, options.store_port, options.job_token);
  }
  // Every rank reports here after its error; rank 0 waits for all of them (bounded).
  void done() {
    gw::rendezvous::store_client c(options.store_host, options.store_port, options.job_token, std::chrono::seconds(20));
    c.set("test/done/" + std::to_string(options.rank), std::string("1"));
    if (options.rank != 0) return;
    std::vector<std::string> keys;
    for (int r = 0; r < ranks; ++r) keys.push_back("test/done/" + std::to_string(r));
    c.wait(keys);
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  GRADWIRE_WORKER_CHECK(mode == "model" || mode == "nan" || mode == "log" || mode == "same-port" ||
                            mode == "batch-script" || ((mode == "world-size" || mode == "hold") && argc > 2),
                        "usage: bad_input_worker model|nan|log|world-size K|hold FILE|same-port|batch-script");
  const int rank1_size = mode == "world-size" ? std::atoi(argv[2]) : 0;
  int me = -1;
  std::optional<gw::errc> got;
  try {
#if defined(GRADWIRE_TEST_UCX)
    if (mode == "world-size") {
      held_store store(rank1_size);
      me = store.options.rank;
      try {
        gw::transport::ucx t(store.options);
        std::printf("OK\n");
      } catch (const gw::error& e) {
        got = e.kind();
        std::printf("ERROR %s: %s\n", kind_name(e.kind()).c_str(), e.details().c_str());
      }
      std::fflush(stdout);
      store.done();
      GRADWIRE_WORKER_CHECK(got == expected_kind(mode, me), "rank " + std::to_string(me) + " expected " +
                                                                kind_name(expected_kind(mode, me)) + ", got " +
                                                                kind_name(got));
      return 0;
    }
#endif
    me = gw::cluster::detect().rank;  // known before the join, which may fail
    if (mode == "hold" || mode == "same-port" || mode == "batch-script") {
      auto t = GRADWIRE_TEST_JOIN();
      if (mode == "hold") {
        std::printf("JOINED\n");
        std::fflush(stdout);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // a bounded poll
        while (!std::filesystem::exists(argv[2])) {
          GRADWIRE_WORKER_CHECK(std::chrono::steady_clock::now() < until, std::string(argv[2]) + " within 60 s");
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        gw::collective::communicator c(std::move(t));
        gw::collective::barrier(c);  // the job was whole all along
      }
      std::printf("OK\n");
      std::fflush(stdout);
      GRADWIRE_WORKER_CHECK(!expected_kind(mode, me), "rank " + std::to_string(me) + " expected " +
                                                          kind_name(expected_kind(mode, me)) + ", got no error");
      return 0;
    }
    auto t = join(mode, rank1_size);
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
    for (int step = 0; step < (mode == "log" ? 1 : 3); ++step) {
      if (mode == "nan" && me == 1 && step == 1) grads[0][123] = std::nanf("");
      s.step(grads);
    }
    std::printf("OK\n");
  } catch (const gw::error& e) {
    got = e.kind();
    std::printf("ERROR %s: %s\n", kind_name(e.kind()).c_str(), e.details().c_str());
  }
  const auto expected = expected_kind(mode, me);
  const bool as_expected = expected == any_error ? got.has_value() : got == expected;
  GRADWIRE_WORKER_CHECK(as_expected, "rank " + std::to_string(me) + " expected " + kind_name(expected) + ", got " +
                                         kind_name(got) + " (" + mode + ")");
  return 0;
}
