// docs/errors.md's in-process code: catching a gradwire::error, for a lost peer and for a bad call.
#include <gradwire/gradwire.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "snippet_support.hpp"

namespace gw = gradwire;
using snippets::Model;

// The page's first block: a step whose failure is caught and reported.
template <class Strategy, class Gradients>
void step_or_report(Strategy& strategy, const Gradients& grads) {
  // [docs:catch]
  try {
    strategy.step(grads);
  } catch (const gradwire::error& e) {
    if (e.kind() == gradwire::errc::peer_lost) { /* restart the job from the last checkpoint */ }
    std::fprintf(stderr, "%s\n", e.what());      // details + ": " + the kind, e.g. "...: peer lost"
    // e.details(): the message without the kind; e.code() == gradwire::errc::timeout also works
  }
  // [/docs:catch]
}

// Runs `fn` with stderr going to a file, and returns what was written there (and echoes it).
template <class Fn>
std::string captured_stderr(Fn&& fn) {
  const char* path = "errors_stderr.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  if (!std::freopen(path, "w", stderr)) throw std::runtime_error("cannot redirect stderr");
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "%s", text.c_str());
  return text;
}

int main() {
  const unsigned seed = std::random_device{}();
  const auto data = snippets::make_batches(Model::shape, 1, 4, seed);

  // Replica 1 fails before its step: replica 0's step fails with peer_lost, caught above.
  bool reported = false;
  std::string root_cause;
  const std::string lost = captured_stderr([&] {
    try {
      gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
        Model model(seed);
        gw::mirrored<gw::tensor_view<float>, gw::optim::adam> strategy(endpoint, model.parameter_views());
        if (endpoint.rank() == 1) throw std::runtime_error("replica 1 ran out of data");
        model.forward_backward(data[0]);
        step_or_report(strategy, model.gradient_views());
        reported = true;
      });
    } catch (const std::runtime_error& e) {
      root_cause = e.what();  // run_inproc rethrows the root cause
    }
  });
  snippets::expect("run_inproc rethrows the root cause", root_cause == "replica 1 ran out of data");
  snippets::expect("replica 0 caught its error and went on", reported);
  snippets::expect("replica 0 reported a peer_lost naming replica 1 and the cause",
                   lost.find("rank 1 failed") != std::string::npos &&
                       lost.find("ran out of data") != std::string::npos &&
                       lost.find(": peer lost") != std::string::npos);

  // A bad call: one gradient for two parameter tensors is an invalid_argument.
  const std::string bad = captured_stderr([&] {
    Model model(seed);
    gw::one_device<gw::tensor_view<float>, gw::optim::sgd> strategy(model.parameter_views());
    const std::vector<std::vector<float>> one_gradient{std::vector<float>(Model::shape.weights())};
    step_or_report(strategy, one_gradient);
  });
  snippets::expect("a bad call is reported as invalid_argument with what was wrong",
                   bad.find("strategy::step: got 1 gradient tensors for 2 parameter tensors: invalid argument") !=
                       std::string::npos);
  return snippets::report("snippet errors", seed);
}
