// any_transport: collectives and strategies through the erased interface give the results
// of the transport it holds; capabilities forward, or fail with a clear error.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/any.hpp>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "collective/collective_support.hpp"
#include "helpers/close.hpp"
#include "helpers/errors.hpp"
#include "helpers/least_squares.hpp"
#include "helpers/reference.hpp"

namespace gw = gradwire;
using gw::transport::any_transport;
using gw::transport::inproc;
using gradwire::testing::error_of;
using namespace std::chrono_literals;

namespace {

std::span<std::byte> bytes(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }

const gw::testing::least_squares model{5, 3, 4};

// A rank's outcome as text ("" for success), so that a failure shows the rank's error.
std::string what_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

// Trains `steps` steps of Strategy over N threads; returns rank 0's parameters after each.
template <class Transport, class Make>
std::vector<std::vector<double>> train(int ranks, int workers, int steps, Make make) {
  std::mt19937_64 gen(7);
  std::vector<std::vector<gw::testing::batch_data>> data(steps);
  for (auto& s : data)
    for (int w = 0; w < workers; ++w) s.push_back(model.random_batch(gen));
  std::vector<std::vector<double>> history(static_cast<std::size_t>(steps));
  gw::transport::run_inproc(ranks, [&](inproc t) {
    const int me = t.rank();
    std::vector<gw::host_tensor<double>> p;
    p.emplace_back(gw::shape{model.outputs * model.inputs});
    p.emplace_back(gw::shape{model.outputs});
    for (std::size_t i = 0; i < p[0].size(); ++i) p[0][i] = 0.1 * std::sin(double(i) + me);
    for (std::size_t i = 0; i < p[1].size(); ++i) p[1][i] = 0.05 * double(i) - me;
    auto s = make(Transport(t), std::move(p));
    if constexpr (requires { s.serve(); })
      if (s.is_server()) return (void)s.serve();
    for (int k = 0; k < steps; ++k) {
      const auto q = s.parameters();
      s.step(model.gradients<double>(q[0].data(), q[1].data(), data[k][me]));
      if (me == 0)
        for (const auto& t : q) history[k].insert(history[k].end(), t.data(), t.data() + t.size());
    }
  });
  return history;
}
// Makes a parameter_server<Mode> strategy with one server rank (the last), for train().
template <class Mode, class Optimizer>
auto one_server(Optimizer opt) {
  return [opt](auto transport, auto params) {
    gw::ps::options o;
    o.servers = 1;
    o.timeout = 60s;
    using S = gw::parameter_server<gw::host_tensor<double>, Optimizer, Mode, decltype(transport)>;
    return S(std::move(transport), std::move(params), opt, typename S::aggregation_type(o));
  };
}

}  // namespace

// Holding inproc, receive-and-add is inproc's fused one; holding staging_only (no fused
// receive), it is any_transport's own staged one.
TEMPLATE_TEST_CASE("any_transport: all-reduce through the erased transport matches a float64 reference",
                   "[any_transport]", inproc, gw::test::staging_only) {
  for (int ranks : {2, 3, 4})
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(100003)}) {
      const std::uint64_t seed = std::random_device{}();
      std::vector<std::vector<float>> inputs, results(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r) inputs.push_back(gw::test::random_input<float>(seed, r, n));
      const auto expected = gw::test::serial_reduce(inputs, true);
      gw::transport::run_inproc(ranks, [&](inproc t) {
        // Claims nothing beyond the transport concept: staging_only has nothing more.
        using erased = gw::transport::basic_any_transport<>;
        gw::collective::communicator<erased> comm{erased(TestType{t})};
        auto data = inputs[static_cast<std::size_t>(t.rank())];
        // Twice: the second reuses the staging buffers the first gave back.
        auto again = data;
        gw::collective::all_reduce(comm, std::span<float>(data), gw::collective::reduce_op::average);
        gw::collective::all_reduce(comm, std::span<float>(again), gw::collective::reduce_op::average);
        gw::test::expect(again == data, "a second all-reduce of the same data gives the same bits");
        results[static_cast<std::size_t>(t.rank())] = std::move(data);
      });
      for (int r = 0; r < ranks; ++r) {
        INFO("ranks " << ranks << ", n " << n << ", rank " << r << ", seed " << seed);
        REQUIRE(gw::test::count_wrong(results[r], expected, gw::test::sum_tolerance<float>(ranks)) == 0);
      }
    }
}

TEST_CASE("any_transport: mirrored and a parameter server train as they do over inproc", "[any_transport]") {
  const gw::optim::adam adam({.lr = 0.01});
  auto mirrored = [&](auto transport, auto params) {
    using S = gw::strategy<gw::host_tensor<double>, gw::optim::adam, gw::aggregation::all_reduce, decltype(transport)>;
    return S(std::move(transport), std::move(params), adam);
  };
  const auto direct = train<inproc>(3, 3, 6, mirrored);
  const auto erased = train<any_transport>(3, 3, 6, mirrored);
  gw::test::require_trajectories_close(erased, direct);

  // Synchronous PS needs wait_any, which any_transport forwards; it equals all-reduce.
  const auto served = train<any_transport>(4, 3, 6, one_server<gw::ps::sync>(adam));
  gw::test::require_trajectories_close(served, direct);
}

TEST_CASE("any_transport: requests forward completion, cancellation and wait_any", "[any_transport]") {
  gw::transport::inproc_group group(2);
  auto outcomes = group.run([&](inproc t) {
    any_transport a(t);
    const auto until = gw::clock::now() + 10s;
    if (a.rank() == 0) {
      std::vector<int> first{1, 2, 3}, second{4, 5, 6}, go(1);
      auto ready = a.async_recv(1, 11, bytes(go));  // rank 1 has dropped its first request
      a.wait(ready, until);
      auto s1 = a.async_send(1, 9, bytes(first));
      auto s2 = a.async_send(1, 9, bytes(second));
      a.wait(s1, until), a.wait(s2, until);
    } else {
      std::vector<int> dropped(3, -1), got(3, -1), other(3, -1);
      {  // withdrawn before a message arrives: its buffer is never written
        auto r = a.async_recv(0, 9, bytes(dropped));
      }
      std::vector<int> go{1};
      auto ready = a.async_send(0, 11, bytes(go));
      a.wait(ready, until);
      auto idle = a.async_recv(0, 10, bytes(other));  // never sent
      auto r = a.async_recv(0, 9, bytes(got));
      any_transport::request* pending[] = {&idle, &r};
      gw::test::expect(a.wait_any(pending, until) == 1, "wait_any picks the request that completed");
      a.wait(r, until);
      gw::test::expect(got == std::vector<int>{1, 2, 3}, "first message into the live request");
      gw::test::expect(dropped == std::vector<int>(3, -1), "a withdrawn request's buffer is untouched");
      auto r2 = a.async_recv(0, 9, bytes(got));
      a.wait(r2, until);
      gw::test::expect(got == std::vector<int>{4, 5, 6}, "second message in order");
    }
  });
  for (auto& e : outcomes) REQUIRE(what_of(e) == "");
}

namespace {
// inproc under another name: an any_transport around it holds another erased type.
struct another_inproc : inproc {};
}  // namespace

// It claims only what it is given: a capability it does not claim is not there to call,
// and a transport without a claimed capability does not convert (both at compile time).
using gw::transport::basic_any_transport;
namespace caps = gw::transport::caps;
static_assert(!gw::concepts::loss_tolerant_transport<any_transport>);
static_assert(!std::is_constructible_v<basic_any_transport<caps::loss_tolerant>, inproc>);  // inproc cannot lose a peer
static_assert(!std::is_constructible_v<any_transport, gw::test::staging_only>);  // no wait_any, fail or topology
static_assert(std::is_constructible_v<basic_any_transport<>, gw::test::staging_only>);
static_assert(!gw::concepts::multiplexing_transport<basic_any_transport<>>);
static_assert(gw::concepts::loss_tolerant_transport<basic_any_transport<caps::loss_tolerant>> &&
              gw::concepts::conditionally_loss_tolerant_transport<basic_any_transport<caps::loss_tolerant>>);

TEST_CASE("any_transport: errors of the held transport and of misuse are clear", "[any_transport]") {
  gw::transport::inproc_group group(2);
  any_transport a(group.endpoint(0));
  REQUIRE(a.target<inproc>() != nullptr);
  REQUIRE(a.target<gw::transport::local>() == nullptr);

  std::vector<int> in(2);
  auto r = a.async_recv(1, 3, bytes(in));
  REQUIRE(error_of([&] { a.wait(r, gw::clock::now() + 50ms); }).first == gw::errc::timeout);

  any_transport::request empty;
  auto [kind, what] = error_of([&] { a.wait(empty, gw::clock::now() + 1s); });
  CHECK(kind == gw::errc::invalid_argument);
  CHECK_THAT(what, Catch::Contains("empty or already finished request"));

  // A request made around another transport type is refused, not reinterpreted.
  any_transport other(another_inproc{group.endpoint(0)});
  REQUIRE(other.target<inproc>() == nullptr);
  REQUIRE(other.target<another_inproc>() != nullptr);
  auto foreign = other.async_recv(1, 4, bytes(in));
  std::tie(kind, what) = error_of([&] { a.wait(foreign, gw::clock::now() + 1s); });
  CHECK(kind == gw::errc::invalid_argument);
  CHECK_THAT(what, Catch::Contains("different transport type"));
  CHECK_THAT(what, Catch::Contains("gradwire::transport::inproc"));  // readable, not mangled

  any_transport moved(std::move(a));
  REQUIRE(moved.rank() == 0);
  std::tie(kind, what) = error_of([&] { (void)a.size(); });  // NOLINT(bugprone-use-after-move): the point
  CHECK(kind == gw::errc::invalid_argument);
  CHECK_THAT(what, Catch::Contains("moved from"));
}

namespace {
// staging_only (no fused receive-and-add) that can wait on whichever request is done first.
struct staging_with_wait_any : gw::test::staging_only {
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until) { return inner.wait_any(requests, until); }
};
}  // namespace

TEST_CASE("any_transport: a staged receive-and-add adds once, into its own target, and lends its buffer safely",
          "[any_transport]") {
  gw::transport::inproc_group group(2);
  auto outcomes = group.run([&](inproc t) {
    basic_any_transport<caps::multiplexing> a(staging_with_wait_any{t});
    const auto until = gw::clock::now() + 10s;
    std::vector<int> go{1};
    if (a.rank() == 0) {
      std::vector<float> message{1, 2, 3};
      auto ready = a.async_recv(1, 11, bytes(go));
      a.wait(ready, until);
      auto sent = a.async_send(1, 9, std::as_bytes(std::span(message)));
      a.wait(sent, until);
      return;
    }
    std::vector<float> first(3, 10.0f), second(3, 20.0f), idle_target(3, 0.0f);
    {  // withdrawn: its staging buffer goes back to the spares, to be lent again below
      auto dropped = a.async_recv_accumulate(0, 9, std::span(first));
    }
    auto idle = a.async_recv_accumulate(0, 10, std::span(idle_target));  // never sent
    auto r = a.async_recv_accumulate(0, 9, std::span(second));
    auto ready = a.async_send(0, 11, bytes(go));
    a.wait(ready, until);
    decltype(a)::request* pending[] = {&idle, &r};
    gw::test::expect(a.wait_any(pending, until) == 1, "wait_any picks the staged request that completed");
    a.wait(r, until);
    gw::test::expect(second == std::vector<float>{21, 22, 23}, "the message is added into its target");
    gw::test::expect(first == std::vector<float>(3, 10.0f), "a withdrawn target is untouched");
    gw::test::expect(!r, "a waited request is empty");
    try {
      a.wait(r, until);
      gw::test::expect(false, "a second wait is refused");
    } catch (const gw::error& e) {
      gw::test::expect(e.kind() == gw::errc::invalid_argument, "a second wait is invalid_argument");
    }
    gw::test::expect(second == std::vector<float>{21, 22, 23}, "and adds nothing twice");
  });
  for (auto& e : outcomes) REQUIRE(what_of(e) == "");
}

TEST_CASE("any_transport lends the smallest staging buffer that fits, else grows the largest", "[any_transport]") {
  // Spares of 100, 4000 and 1000 bytes (capacities), as steps of different sizes leave them.
  const auto spares_of = [](std::initializer_list<std::size_t> capacities) {
    std::vector<std::vector<std::byte>> spares;
    for (std::size_t c : capacities) spares.emplace_back().reserve(c);
    return spares;
  };
  auto spares = spares_of({100, 4000, 1000});
  const auto lent = [&](std::size_t size) {
    const auto it = gw::transport::detail::spare_to_lend(spares, size);
    return it == spares.end() ? std::size_t{0} : it->capacity();
  };
  CHECK(lent(1) == 100);
  CHECK(lent(100) == 100);    // exactly large enough
  CHECK(lent(101) == 1000);   // the smallest that fits, not the largest
  CHECK(lent(1000) == 1000);
  CHECK(lent(1001) == 4000);
  CHECK(lent(4000) == 4000);
  CHECK(lent(5000) == 4000);  // none fits: the largest, whose growth touches the fewest fresh bytes
  spares = spares_of({300, 200});
  CHECK(lent(1000) == 300);
  spares.clear();
  CHECK(lent(8) == 0);        // none at all: a fresh buffer
}

TEST_CASE("any_transport: an async parameter server over a transport that cannot lose peers runs as over inproc",
          "[any_transport]") {
  // any_transport claims no loss tolerance (inproc has none): the server does not count on
  // it, and trains normally.
  const auto history = train<any_transport>(3, 2, 6, one_server<gw::ps::async>(gw::optim::sgd({.lr = 0.05})));
  REQUIRE(history.size() == 6);
  for (const auto& step : history) {
    REQUIRE(step.size() == model.outputs * model.inputs + model.outputs);
    for (double v : step) REQUIRE(std::isfinite(v));
  }
  REQUIRE(history.back() != history.front());  // it trained
}

TEST_CASE("any_transport: fail() reaches the peers of the held transport", "[any_transport]") {
  gw::transport::inproc_group group(2);
  auto outcomes = group.run([&](inproc t) {
    any_transport a(t);
    if (a.rank() == 0) {
      a.fail(gw::errc::mismatch, "rank 0 saw a mismatch");
      return;
    }
    std::vector<int> in(1);
    auto r = a.async_recv(0, 1, bytes(in));
    a.wait(r, gw::clock::now() + 10s);
  });
  REQUIRE(outcomes[1]);
  try {
    std::rethrow_exception(outcomes[1]);
  } catch (const gw::error& e) {
    CHECK(e.kind() == gw::errc::mismatch);
    CHECK_THAT(std::string(e.what()), Catch::Contains("rank 0 saw a mismatch"));
  }
}
