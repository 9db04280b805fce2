// Bad input a user can give a strategy: models that differ between ranks, NaN and infinite gradients, bad options.
// docs/errors.md ("Every input and what a bad value gets") cites each test here by name.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <gradwire/gradwire.hpp>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "../helpers/errors.hpp"

namespace gw = gradwire;
using Catch::Contains;

namespace {

using tensor = gw::host_tensor<float>;

std::vector<tensor> params_of(const std::vector<gw::shape>& shapes) {
  std::vector<tensor> p;
  for (const auto& s : shapes) p.emplace_back(s);
  return p;
}

// Each rank's outcome of fn on its own thread: ok, or (kind, message).
struct outcome {
  bool failed = false;
  gw::errc kind{};
  std::string what;
};
std::vector<outcome> run_ranks(int n, const std::function<void(gw::transport::inproc)>& fn) {
  gw::transport::inproc_group group(n);
  const auto raw = group.run(fn);
  std::vector<outcome> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (!raw[r]) continue;
    out[r].failed = true;
    try {
      std::rethrow_exception(raw[r]);
    } catch (const gw::error& e) {
      out[r].kind = e.kind();
      out[r].what = e.what();
    } catch (const std::exception& e) {
      out[r].kind = gw::errc::protocol;  // not a gradwire::error: the test fails below on the kind
      out[r].what = std::string("not a gradwire::error: ") + e.what();
    }
  }
  return out;
}

// Short deadlines: a hang shows up as a timeout in seconds, which every check refuses.
gw::collective::communicator_options quick() {
  gw::collective::communicator_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}
gw::ps::options quick_ps() {
  gw::ps::options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

enum class aggregation_kind { all_reduce, central, parameter_server, averaging };
const char* name_of(aggregation_kind a) {
  switch (a) {
    case aggregation_kind::all_reduce: return "all_reduce";
    case aggregation_kind::central: return "central";
    case aggregation_kind::parameter_server: return "parameter_server";
    case aggregation_kind::averaging: return "averaging";
  }
  return "?";
}
const aggregation_kind every_aggregation[] = {aggregation_kind::all_reduce, aggregation_kind::central,
                                              aggregation_kind::parameter_server, aggregation_kind::averaging};

// Builds the strategy of `kind` on this rank and runs `body(strategy)` on it; a parameter
// server rank serves instead.
template <class Tensor = tensor, class Body>
void with_strategy(aggregation_kind kind, gw::transport::inproc t, std::vector<Tensor> params, Body&& body) {
  const gw::optim::sgd opt({.lr = 0.1});
  switch (kind) {
    case aggregation_kind::all_reduce: {
      gw::mirrored<Tensor, gw::optim::sgd> s(std::move(t), std::move(params), opt, gw::aggregation::all_reduce(), quick());
      body(s);
      return;
    }
    case aggregation_kind::central: {
      gw::central_storage<Tensor, gw::optim::sgd> s(std::move(t), std::move(params), opt, gw::aggregation::central(),
                                                    quick());
      body(s);
      return;
    }
    case aggregation_kind::parameter_server: {
      gw::parameter_server<Tensor, gw::optim::sgd, gw::ps::sync> s(
          std::move(t), std::move(params), opt, gw::aggregation::parameter_server<gw::ps::sync>(quick_ps()), quick());
      if (s.is_server())
        s.serve();
      else
        body(s);
      return;
    }
    case aggregation_kind::averaging: {
      gw::local_sgd<Tensor, gw::optim::sgd, 2> s(std::move(t), std::move(params), opt, gw::aggregation::averaging<2>(),
                                                 quick());
      body(s);
      return;
    }
  }
}

// RAII: an environment variable for the scope of a test.
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("ranks that build different models all get a mismatch at construction, naming both models",
          "[strategy][bad_input]") {
  struct model_case {
    const char* name;
    std::vector<gw::shape> rank0, other;
    std::vector<const char*> says;
  };
  const std::vector<model_case> cases{
      {"1001 against 1000 elements", {{1001}, {10, 10}}, {{1000}, {10, 10}},
       {"rank 0 has 2 tensors of f32, 1101 elements: [1001], [10, 10]", "rank 1 has 2 tensors of f32, 1100 elements",
        "tensor 0 is [1001] on rank 0, [1000] on rank 1"}},
      {"another tensor count", {{1000}, {10, 10}}, {{1000}, {10, 10}, {5}},
       {"rank 0 has 2 tensors", "rank 1 has 3 tensors", "tensor count 2 on rank 0, 3 on rank 1"}},
      {"same element count, other shape", {{2, 3}, {7}}, {{3, 2}, {7}},
       {"tensor 0 is [2, 3] on rank 0, [3, 2] on rank 1"}},
      {"another order", {{7}, {2, 3}}, {{2, 3}, {7}}, {"tensor 0 is [7] on rank 0, [2, 3] on rank 1"}},
      // Past 8 tensors a model is named by its first 8 shapes and how many more it has.
      {"11 tensors, the last differs",
       {{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}},
       {{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {12}},
       {"rank 0 has 11 tensors of f32, 66 elements: [1], [2], [3], [4], [5], [6], [7], [8], ... (3 more)",
        "rank 1 has 11 tensors of f32, 67 elements: [1], [2], [3], [4], [5], [6], [7], [8], ... (3 more)",
        "tensor 10 is [11] on rank 0, [12] on rank 1"}},
  };
  for (const auto kind : every_aggregation)
    for (const auto& c : cases) {
      DYNAMIC_SECTION(name_of(kind) << ": " << c.name) {
        // 3 ranks: rank 1 differs (and is a worker; the parameter server's is rank 2).
        const auto out = run_ranks(3, [&](gw::transport::inproc t) {
          const bool odd = t.rank() == 1;
          with_strategy(kind, std::move(t), params_of(odd ? c.other : c.rank0), [](auto&) {
            FAIL("the strategy was built although the ranks' models differ");
          });
        });
        for (int r = 0; r < 3; ++r) {
          CAPTURE(r, out[r].what);
          REQUIRE(out[r].failed);
          REQUIRE(out[r].kind == gw::errc::mismatch);
          REQUIRE_THAT(out[r].what, Contains("the ranks built different models") &&
                                        Contains("rank 1 differs from rank 0") && Contains("same tensors, shapes"));
          for (const char* s : c.says) REQUIRE_THAT(out[r].what, Contains(s));
        }
      }
    }
}

TEST_CASE("a rank that builds its model in double beside float ranks gets a mismatch naming both dtypes",
          "[strategy][bad_input]") {
  const auto out = run_ranks(2, [&](gw::transport::inproc t) {
    if (t.rank() == 0) {
      gw::mirrored<gw::host_tensor<double>, gw::optim::sgd> s(std::move(t), {gw::host_tensor<double>(gw::shape{4})},
                                                              gw::optim::sgd(), gw::aggregation::all_reduce(), quick());
    } else {
      gw::mirrored<tensor, gw::optim::sgd> s(std::move(t), {tensor(gw::shape{4})}, gw::optim::sgd(), gw::aggregation::all_reduce(), quick());
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(out[r].what);
    REQUIRE(out[r].kind == gw::errc::mismatch);
    REQUIRE_THAT(out[r].what, Contains("dtype f64 on rank 0, f32 on rank 1"));
  }
}

TEST_CASE("ranks that agree on their model build the strategy: the model check costs one all_gather",
          "[strategy][bad_input]") {
  for (const auto kind : every_aggregation) {
    DYNAMIC_SECTION(name_of(kind)) {
      const auto out = run_ranks(3, [&](gw::transport::inproc t) {
        with_strategy(kind, std::move(t), params_of({{1001}, {10, 10}, {0}}), [](auto&) {});
      });
      for (int r = 0; r < 3; ++r) {
        CAPTURE(r, out[r].what);
        REQUIRE_FALSE(out[r].failed);
      }
    }
  }
}

TEST_CASE("first_non_finite finds the first NaN or infinity where a scalar scan does, and nothing else",
          "[kernels][bad_input]") {
  std::mt19937_64 gen(20240611);
  auto check = [&]<class T>(T) {
    const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                          std::numeric_limits<T>::signaling_NaN()};
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{4097},
                          std::size_t{100003}}) {
      std::vector<T> x(n);
      std::normal_distribution<T> dist;
      for (auto& v : x) v = dist(gen) * T(1e3);
      // Finite extremes are finite.
      if (n >= 4) {
        x[0] = std::numeric_limits<T>::max();
        x[1] = std::numeric_limits<T>::lowest();
        x[2] = std::numeric_limits<T>::denorm_min();
        x[3] = -T(0);
      }
      CAPTURE(n);
      REQUIRE(gw::kernels::first_non_finite(x.data(), n) == n);
      REQUIRE_FALSE(gw::kernels::any_non_finite(x.data(), n));
      if (n == 0) continue;
      for (int trial = 0; trial < 20; ++trial) {
        auto y = x;
        const std::size_t at = std::uniform_int_distribution<std::size_t>(0, n - 1)(gen);
        const std::size_t later = std::uniform_int_distribution<std::size_t>(at, n - 1)(gen);
        y[later] = specials[trial % 5];
        y[at] = specials[(trial + 2) % 5];
        std::size_t expected = n;
        for (std::size_t i = 0; i < n; ++i)
          if (!std::isfinite(y[i])) {
            expected = i;
            break;
          }
        CAPTURE(at, later);
        REQUIRE(expected == at);
        REQUIRE(gw::kernels::first_non_finite(y.data(), n) == expected);
        REQUIRE(gw::kernels::any_non_finite(y.data(), n));
      }
    }
  };
  check(float{});
  check(double{});
}

TEST_CASE("with the finite check on, a NaN or infinite gradient fails every rank, naming the rank, tensor and element",
          "[strategy][bad_input]") {
  const std::vector<std::pair<float, const char*>> bad{{std::nanf(""), "holds nan at element 7 of 100"},
                                                       {std::numeric_limits<float>::infinity(), "holds inf at element 7"},
                                                       {-std::numeric_limits<float>::infinity(), "holds -inf at element 7"}};
  for (const auto kind : every_aggregation)
    for (const auto& [value, says] : bad) {
      DYNAMIC_SECTION(name_of(kind) << ": " << says) {
        const auto out = run_ranks(3, [&](gw::transport::inproc t) {
          const int me = t.rank();
          with_strategy(kind, std::move(t), params_of({{10}, {10, 10}}), [&](auto& s) {
            REQUIRE_FALSE(s.checks_finite_gradients());  // off by default
            s.check_finite_gradients(true);
            std::vector<std::vector<float>> grads{std::vector<float>(10, 0.5f), std::vector<float>(100, 0.25f)};
            s.step(grads);  // a good step first
            if (me == 1) grads[1][7] = value;
            // averaging<2> communicates on every second step: the others learn at that one.
            for (int k = 0; k < 2; ++k) s.step(grads);
          });
        });
        for (int r = 0; r < 3; ++r) {
          CAPTURE(r, out[r].what);
          REQUIRE(out[r].failed);
          REQUIRE_THAT(out[r].what, Contains("strategy::step on rank 1: gradient 1 (parameter of shape [10, 10]) ") &&
                                        Contains(says) && Contains("GRADWIRE_CHECK_FINITE"));
          // The rank with the bad gradient: invalid_argument; the others learn it from it.
          if (r == 1)
            REQUIRE(out[r].kind == gw::errc::invalid_argument);
          else
            REQUIRE((out[r].kind == gw::errc::peer_lost && out[r].what.find("rank 1 failed") != std::string::npos));
        }
      }
    }
}

TEST_CASE("the finite check: off by default a NaN passes, and the incremental step, no_sync and GRADWIRE_CHECK_FINITE",
          "[strategy][bad_input]") {
  using one = gw::one_device<tensor, gw::optim::sgd>;
  const std::vector<float> nan_at_3{0, 0, 0, std::nanf(""), 0};
  SECTION("off: nothing reads the gradient; the parameters take the NaN") {
    one s(params_of({{5}}), gw::optim::sgd({.lr = 0.1}));
    s.step(std::vector<std::vector<float>>{nan_at_3});
    REQUIRE(std::isnan(s.parameters()[0][3]));
  }
  SECTION("on: step.ready refuses it before the parameters change") {
    one s(params_of({{5}}), gw::optim::sgd({.lr = 0.1}));
    s.check_finite_gradients(true);
    auto step = s.begin_step();
    const auto e = gw::testing::error_of([&] { step.ready(0, nan_at_3); });
    REQUIRE(e.first == gw::errc::invalid_argument);
    REQUIRE_THAT(e.second, Contains("rank 0: gradient 0 (parameter of shape [5]) holds nan at element 3 of 5"));
    REQUIRE(s.parameters()[0][3] == 0.0f);
  }
  SECTION("on: a micro-batch (no_sync) is checked too") {
    one s(params_of({{5}}), gw::optim::sgd({.lr = 0.1}));
    s.check_finite_gradients(true);
    const auto e = gw::testing::error_of([&] { s.step(std::vector<std::vector<float>>{nan_at_3}, gw::no_sync); });
    REQUIRE(e.first == gw::errc::invalid_argument);
  }
  SECTION("GRADWIRE_CHECK_FINITE=1 turns it on, 0 leaves it off, anything else is a config error naming it") {
    {
      scoped_env on("GRADWIRE_CHECK_FINITE", "1");
      REQUIRE(one(params_of({{5}})).checks_finite_gradients());
    }
    {
      scoped_env off("GRADWIRE_CHECK_FINITE", "0");
      REQUIRE_FALSE(one(params_of({{5}})).checks_finite_gradients());
    }
    scoped_env bad("GRADWIRE_CHECK_FINITE", "yes");
    const auto e = gw::testing::error_of([&] { one s(params_of({{5}})); });
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Contains("GRADWIRE_CHECK_FINITE='yes' is neither 0 nor 1"));
  }
}

TEST_CASE("bad options of collectives and parameter servers are clear errors on every rank, not hangs or silence",
          "[strategy][bad_input]") {
  const std::vector<std::vector<float>> grads{std::vector<float>(16, 1.0f)};
  auto every_rank = [](const std::vector<outcome>& out, gw::errc kind, const char* says) {
    for (std::size_t r = 0; r < out.size(); ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].failed);
      REQUIRE(out[r].kind == kind);
      REQUIRE_THAT(out[r].what, Contains(says));
    }
  };
  SECTION("communicator_options::timeout of 0 or below") {
    for (auto ms : {0, -1}) {
      const auto out = run_ranks(2, [&](gw::transport::inproc t) {
        auto o = quick();
        o.timeout = std::chrono::milliseconds(ms);
        gw::mirrored<tensor, gw::optim::sgd> s(std::move(t), params_of({{16}}), gw::optim::sgd(), gw::aggregation::all_reduce(), o);
      });
      every_rank(out, gw::errc::invalid_argument, "communicator_options::timeout = ");
    }
  }
  SECTION("a bucket budget of 0 bytes") {
    for (const auto kind : {aggregation_kind::all_reduce, aggregation_kind::central, aggregation_kind::averaging}) {
      CAPTURE(name_of(kind));
      const auto out = run_ranks(2, [&](gw::transport::inproc t) {
        if (kind == aggregation_kind::all_reduce)
          gw::mirrored<tensor, gw::optim::sgd> s(std::move(t), params_of({{16}}), gw::optim::sgd(),
                                                 gw::aggregation::all_reduce(0), quick());
        else if (kind == aggregation_kind::central)
          gw::central_storage<tensor, gw::optim::sgd> s(std::move(t), params_of({{16}}), gw::optim::sgd(),
                                                        gw::aggregation::central(0, 0), quick());
        else
          gw::local_sgd<tensor, gw::optim::sgd, 1> s(std::move(t), params_of({{16}}), gw::optim::sgd(),
                                                     gw::aggregation::averaging<1>(std::size_t{0}), quick());
      });
      every_rank(out, gw::errc::invalid_argument, "bucket budget must be positive");
    }
  }
  SECTION("ps::backup_workers<b> with b at or above the number of workers") {
    const auto out = run_ranks(3, [&](gw::transport::inproc t) {
      gw::parameter_server<tensor, gw::optim::sgd, gw::ps::backup_workers<2>> s(
          std::move(t), params_of({{16}}), gw::optim::sgd(),
          gw::aggregation::parameter_server<gw::ps::backup_workers<2>>(quick_ps()), quick());
    });
    every_rank(out, gw::errc::config, "ps::backup_workers<2> in a job of 2 worker(s)");
  }
  SECTION("ps::options::timeout of 0") {
    const auto out = run_ranks(3, [&](gw::transport::inproc t) {
      auto po = quick_ps();
      po.timeout = std::chrono::milliseconds(0);
      gw::parameter_server<tensor, gw::optim::sgd, gw::ps::sync> s(
          std::move(t), params_of({{16}}), gw::optim::sgd(), gw::aggregation::parameter_server<gw::ps::sync>(po), quick());
    });
    every_rank(out, gw::errc::config, "ps::options::timeout = 0 ms");
  }
  SECTION("ps::options::standby: too few ranks, a standby_lag of 0, a transport that cannot lose a rank") {
    struct bad {
      int ranks;
      std::uint32_t lag;
      const char* says;
    };
    for (const auto& c : {bad{2, 8, "1 server(s) and as many standbys in a job of 2 ranks"},
                          bad{3, 0, "ps::options::standby_lag = 0: it must be from 1"},
                          bad{3, 5000, "ps::options::standby_lag = 5000: it must be from 1"},
                          bad{3, 8, "ps::options::standby needs a transport that survives a lost peer"}}) {
      CAPTURE(c.says);
      const auto out = run_ranks(c.ranks, [&](gw::transport::inproc t) {
        auto po = quick_ps();
        po.standby = true;
        po.standby_lag = c.lag;
        gw::parameter_server<tensor, gw::optim::sgd, gw::ps::sync> s(
            std::move(t), params_of({{16}}), gw::optim::sgd(), gw::aggregation::parameter_server<gw::ps::sync>(po), quick());
      });
      every_rank(out, gw::errc::config, c.says);
    }
  }
  SECTION("ps::options::checkpoint_dir that cannot be created") {
    const std::filesystem::path file = std::filesystem::temp_directory_path() / "gradwire_bad_input_not_a_dir";
    { std::FILE* f = std::fopen(file.c_str(), "w"); REQUIRE(f); std::fclose(f); }
    const auto out = run_ranks(3, [&](gw::transport::inproc t) {
      auto po = quick_ps();
      po.checkpoint_dir = file / "sub";  // below a plain file
      gw::parameter_server<tensor, gw::optim::sgd, gw::ps::sync> s(
          std::move(t), params_of({{16}}), gw::optim::sgd(), gw::aggregation::parameter_server<gw::ps::sync>(po), quick());
      if (s.is_server()) s.serve(); else s.step(grads);
    });
    std::filesystem::remove(file);
    CAPTURE(out[2].what);
    REQUIRE(out[2].kind == gw::errc::config);  // the server
    REQUIRE_THAT(out[2].what, Contains("checkpoint_dir") && Contains("cannot be created"));
    // The workers hear of it from the server: a config error travels with its kind
    // (transport::detail::peer_failure_kind), naming the server and its reason.
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE((out[r].failed && out[r].kind == gw::errc::config));
      REQUIRE_THAT(out[r].what, Contains("rank 2 failed: parameter_server: ps::options::checkpoint_dir"));
    }
  }
}

#if defined(GRADWIRE_HAS_ASIO)
#include <gradwire/asio.hpp>

TEST_CASE("the TCP transport's environment variables: a value that does not parse is a config error naming it",
          "[cluster][bad_input]") {
  const gw::cluster::cluster_spec spec;  // one process; tcp_options only reads the variables
  auto error_with = [&](const char* name, const char* value) {
    const gw::cluster::env_lookup env = [&](const char* asked) -> std::optional<std::string> {
      if (std::string(asked) == name) return std::string(value);
      return std::nullopt;
    };
    return gw::testing::error_of([&] { (void)gw::cluster::tcp_options(spec, env); });
  };
  const std::vector<std::pair<const char*, const char*>> bad{
      {"GRADWIRE_WIRE_CHECKSUM", "yes"},  // was read as 0, silently
      {"GRADWIRE_WIRE_CHECKSUM", "2"},     {"GRADWIRE_TIMEOUT", "abc"},     {"GRADWIRE_TIMEOUT", "-1"},
      {"GRADWIRE_SOCKET_BUFFER", "-1"},    {"GRADWIRE_SOCKET_BUFFER", "1k"}, {"GRADWIRE_POLL_US", "fast"},
      {"GRADWIRE_HEARTBEAT", "1.5"},       {"GRADWIRE_STALL_WARN", "soon"}, {"GRADWIRE_STALL_TIMEOUT", "x"},
      {"GRADWIRE_REJOIN", "yes"},          {"GRADWIRE_REJOIN", "2"}};
  for (const auto& [name, value] : bad) {
    CAPTURE(name, value);
    const auto e = error_with(name, value);
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Contains(std::string(name) + "='" + value + "'"));
  }
  // 0 and 1 still read as before.
  const gw::cluster::env_lookup on = [](const char* asked) -> std::optional<std::string> {
    return std::string(asked) == "GRADWIRE_WIRE_CHECKSUM" ? std::optional<std::string>("1") : std::nullopt;
  };
  REQUIRE(gw::cluster::tcp_options(spec, on).checksum_payload);
  const gw::cluster::env_lookup rejoin = [](const char* asked) -> std::optional<std::string> {
    return std::string(asked) == "GRADWIRE_REJOIN" ? std::optional<std::string>("1") : std::nullopt;
  };
  REQUIRE(gw::cluster::tcp_options(spec, rejoin).rejoin);
  REQUIRE_FALSE(gw::cluster::tcp_options(spec, on).rejoin);
}

TEST_CASE("the TCP transport's environment variables: every value in range reaches its option, the documented "
          "maximum included, and one past it is refused naming the range",
          "[cluster][bad_input]") {
  gw::cluster::cluster_spec spec;
  spec.master_addr = "10.0.0.1";  // not loopback: GRADWIRE_LISTEN_HOST has no default then
  auto with = [&](std::vector<std::pair<std::string, std::string>> set) {
    return gw::cluster::tcp_options(spec, [set](const char* asked) -> std::optional<std::string> {
      for (const auto& [name, value] : set)
        if (name == asked) return value;
      return std::nullopt;
    });
  };
  const auto o = with({{"GRADWIRE_SOCKET_BUFFER", "4194304"},
                       {"GRADWIRE_POLL_US", "250"},
                       {"GRADWIRE_HEARTBEAT", "7"},
                       {"GRADWIRE_TIMEOUT", "12.5"},
                       {"GRADWIRE_STALL_WARN", "3"},
                       {"GRADWIRE_STALL_TIMEOUT", "90"},
                       {"GRADWIRE_LISTEN_HOST", "10.0.0.9"},
                       {"GRADWIRE_HOST_ID", "rack4-node2"}});
  CHECK(o.socket_buffer_bytes == 4194304);
  CHECK(o.poll_before_sleep == std::chrono::microseconds(250));
  CHECK(o.heartbeat_interval == std::chrono::seconds(7));
  CHECK(o.connect_timeout == std::chrono::milliseconds(12500));
  CHECK(o.stall_warn == std::chrono::milliseconds(3000));
  CHECK(o.stall_timeout == std::chrono::milliseconds(90000));
  CHECK(o.listen_host == "10.0.0.9");
  CHECK(o.host_id == "rack4-node2");

  // Unset: the transport's own defaults; an address other than loopback listens everywhere.
  const auto d = with({});
  const gw::transport::asio_tcp_options defaults;
  CHECK(d.socket_buffer_bytes == 0);  // the kernel's buffer sizes
  CHECK(d.poll_before_sleep == defaults.poll_before_sleep);
  CHECK(d.heartbeat_interval == defaults.heartbeat_interval);
  CHECK(d.connect_timeout == defaults.connect_timeout);
  CHECK(d.listen_host.empty());

  // Each integer's range, as docs/errors.md gives it: its maximum is accepted, one more is not.
  using read = long long (*)(const gw::transport::asio_tcp_options&);
  const std::vector<std::tuple<const char*, long long, read>> maxima{
      {"GRADWIRE_SOCKET_BUFFER", 1LL << 30, [](const gw::transport::asio_tcp_options& o) -> long long { return o.socket_buffer_bytes; }},
      {"GRADWIRE_POLL_US", 1000000, [](const gw::transport::asio_tcp_options& o) -> long long { return o.poll_before_sleep.count(); }},
      {"GRADWIRE_HEARTBEAT", 3600, [](const gw::transport::asio_tcp_options& o) -> long long { return o.heartbeat_interval.count(); }}};
  for (const auto& [name, max, option] : maxima) {
    CAPTURE(name);
    CHECK(option(with({{name, std::to_string(max)}})) == max);
    const auto e = gw::testing::error_of([&] { (void)with({{name, std::to_string(max + 1)}}); });
    CHECK(e.first == gw::errc::config);
    CHECK_THAT(e.second, Contains("is not an integer from 0 to " + std::to_string(max)));
  }
}

namespace {

// A loopback port nobody listens on: bound once to learn a free one, then closed.
std::uint16_t unused_loopback_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();  // closed when `a` goes
}

// The launcher's variables for `rank` of a job of `size` whose store is at 127.0.0.1:port,
// plus `extra`.
gw::cluster::env_lookup job_env(int rank, int size, std::uint16_t port,
                                std::vector<std::pair<std::string, std::string>> extra) {
  extra.insert(extra.end(), {{"RANK", std::to_string(rank)},
                             {"WORLD_SIZE", std::to_string(size)},
                             {"MASTER_ADDR", "127.0.0.1"},
                             {"MASTER_PORT", std::to_string(port)}});
  return [extra](const char* asked) -> std::optional<std::string> {
    for (const auto& [name, value] : extra)
      if (name == asked) return value;
    return std::nullopt;
  };
}

}  // namespace

TEST_CASE("MASTER_ADDR:MASTER_PORT where nobody listens: a timeout at GRADWIRE_TIMEOUT naming the address",
          "[cluster][bad_input]") {
  const std::uint16_t port = unused_loopback_port();
  // Rank 1 of 2 does not serve the store: it dials rank 0's, which nobody started.
  const auto env = job_env(1, 2, port, {{"GRADWIRE_TIMEOUT", "1"}});
  const auto start = std::chrono::steady_clock::now();
  const auto e = gw::testing::error_of([&] { (void)gw::cluster::join_tcp({}, env); });
  const auto took = std::chrono::steady_clock::now() - start;
  CAPTURE(e.second);
  REQUIRE(e.first == gw::errc::timeout);
  REQUIRE_THAT(e.second, Contains("nobody listened at 127.0.0.1:" + std::to_string(port) + " (the rendezvous store") &&
                             Contains("before the deadline: is it running, and is the address right?"));
  // It kept trying until the deadline (retries back off to 200 ms; the last one may not fit).
  REQUIRE(took > std::chrono::milliseconds(700));
  REQUIRE(took < std::chrono::seconds(10));
}

TEST_CASE("GRADWIRE_LISTEN_HOST an address not on this host: a config error at listen naming it",
          "[cluster][bad_input]") {
  const std::uint16_t port = unused_loopback_port();
  // 192.0.2.1 (TEST-NET-1, RFC 5737) is assigned to no host. Rank 0 of 2 serves the store
  // on loopback, then cannot listen for its peers there: no peer needed, no deadline waited.
  const auto env = job_env(0, 2, port, {{"GRADWIRE_TIMEOUT", "30"}, {"GRADWIRE_LISTEN_HOST", "192.0.2.1"}});
  const auto start = std::chrono::steady_clock::now();
  const auto e = gw::testing::error_of([&] { (void)gw::cluster::join_tcp({}, env); });
  CAPTURE(e.second);
  REQUIRE(e.first == gw::errc::config);
  REQUIRE_THAT(e.second, Contains("cannot listen on 192.0.2.1:0 (rank 0's listening port)"));
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}
#endif

#if defined(GRADWIRE_HAS_UCX)
#include <gradwire/ucx.hpp>

TEST_CASE("the UCX transport's environment variables: a value that does not parse is a config error naming it",
          "[cluster][bad_input][ucx]") {
  const gw::cluster::cluster_spec spec;  // one process; ucx_options only reads the variables
  auto with = [](const char* name, const char* value) -> gw::cluster::env_lookup {
    return [name, value](const char* asked) -> std::optional<std::string> {
      if (std::string(asked) == name) return std::string(value);
      return std::nullopt;
    };
  };
  struct bad {
    const char *name, *value, *says;
  };
  for (const auto& c : {bad{"GRADWIRE_UCX_BULK_BYTES", "-1", "GRADWIRE_UCX_BULK_BYTES='-1' is not an integer from 0 to 1099511627776"},
                        bad{"GRADWIRE_UCX_BULK_BYTES", "1k", "GRADWIRE_UCX_BULK_BYTES='1k' is not an integer"},
                        bad{"GRADWIRE_UCX_BULK_BYTES", "fast", "GRADWIRE_UCX_BULK_BYTES='fast' is not an integer"},
                        bad{"GRADWIRE_UCX_PEER_ERRORS", "off", "GRADWIRE_UCX_PEER_ERRORS='off' is not an integer from 0 to 1"},
                        bad{"GRADWIRE_UCX_PEER_ERRORS", "yes", "GRADWIRE_UCX_PEER_ERRORS='yes' is not an integer from 0 to 1"},
                        bad{"GRADWIRE_UCX_PEER_ERRORS", "2", "GRADWIRE_UCX_PEER_ERRORS='2' is not an integer from 0 to 1"},
                        bad{"GRADWIRE_UCX_ONE_SIDED", "maybe", "GRADWIRE_UCX_ONE_SIDED=maybe: expected auto, on or off"}}) {
    CAPTURE(c.name, c.value);
    const auto e = gw::testing::error_of([&] { (void)gw::cluster::ucx_options(spec, with(c.name, c.value)); });
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Contains(c.says));
  }
  // The good values read as documented (and differ from the defaults).
  using use = gw::transport::ucx_options::one_sided_use;
  const auto defaults = gw::cluster::ucx_options(spec, with("NONE", ""));
  REQUIRE(defaults.peer_error_handling);
  REQUIRE(defaults.one_sided == use::automatic);
  REQUIRE(defaults.bulk_bytes == (std::size_t{256} << 10));
  REQUIRE_FALSE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_PEER_ERRORS", "0")).peer_error_handling);
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_BULK_BYTES", "4096")).bulk_bytes == 4096);
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_BULK_BYTES", "0")).bulk_bytes == 0);
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_ONE_SIDED", "on")).one_sided == use::always);
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_ONE_SIDED", "off")).one_sided == use::never);
  // 1 and 0, as the other switches (GRADWIRE_UCX_PEER_ERRORS) are written, read as on and off.
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_ONE_SIDED", "1")).one_sided == use::always);
  REQUIRE(gw::cluster::ucx_options(spec, with("GRADWIRE_UCX_ONE_SIDED", "0")).one_sided == use::never);
}

TEST_CASE("ucx refuses a tag at or above 2^48 - 1 with invalid_argument naming it, and delivers the largest tag below",
          "[transport][bad_input][ucx]") {
  gw::transport::ucx_options o;  // one rank: a real UCP worker, no store, messages to itself
  o.rank = 0;
  o.size = 1;
  gw::transport::ucx t(o);
  const std::uint64_t limit = (std::uint64_t{1} << 48) - 1;
  std::vector<std::byte> out(24), in(24);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(7 * i + 1);
  for (const std::uint64_t tag : {limit, limit + 1, std::uint64_t{1} << 63, ~std::uint64_t{0}}) {
    CAPTURE(tag);
    const std::string says = "ucx: tag " + std::to_string(tag) + " is not below 2^48 - 1";
    const auto send = gw::testing::error_of([&] { (void)t.async_send(0, tag, out); });
    REQUIRE(send.first == gw::errc::invalid_argument);
    REQUIRE_THAT(send.second, Contains(says));
    const auto recv = gw::testing::error_of([&] { (void)t.async_recv(0, tag, in); });
    REQUIRE(recv.first == gw::errc::invalid_argument);
    REQUIRE_THAT(recv.second, Contains(says));
  }
  // The refusals left the transport usable: the largest allowed tag goes through, intact,
  // and does not match a receive on another tag.
  auto other = t.async_recv(0, limit - 2, std::span<std::byte>(in.data(), 4));
  auto r = t.async_recv(0, limit - 1, in);
  auto s = t.async_send(0, limit - 1, out);
  const auto until = gw::clock::now() + std::chrono::seconds(10);
  t.wait(s, until);
  t.wait(r, until);
  REQUIRE(in == out);
}

namespace {

namespace ud = gw::transport::detail;

// A UCX engine read by hand: one rank, its own peer (a real UCP worker, no store).
std::unique_ptr<ud::ucx_engine> joined_engine_of_one_rank() {
  gw::transport::ucx_options o;
  o.rank = 0;
  o.size = 1;
  auto e = std::make_unique<ud::ucx_engine>(o);
  e->join();
  return e;
}

}  // namespace

TEST_CASE("ucx: a receive from a peer that said goodbye stays open for a grace, for a message still on the way, "
          "then fails naming the finished peer",
          "[transport][ucx]") {
  // An engine read by hand: one rank, its own peer. The peer's goodbye comes after it
  // flushed what it sent, but a message in the middle of a rendezvous cannot be told from
  // one that never comes, so the receive waits out a grace (1 s) before it fails.
  auto engine = joined_engine_of_one_rank();
  auto& e = *engine;
  std::vector<std::byte> in(8);
  auto receive = e.make_op(false, 0, 5, in.data(), in.size());
  e.post_recv(*receive);
  const auto said = std::chrono::steady_clock::now();
  e.on_goodbye(0);
  REQUIRE(e.peers[0].drained_at);
  CHECK(*e.peers[0].drained_at >= said + std::chrono::seconds(1));
  CHECK(*e.peers[0].drained_at <= std::chrono::steady_clock::now() + std::chrono::seconds(1));
  e.peers[0].drained_at = gw::clock::now() + std::chrono::seconds(60);  // the grace, without a clock race
  e.handle_events();
  CHECK(receive->state == ud::op_status::active);
  e.peers[0].drained_at = gw::clock::now() + std::chrono::milliseconds(0);  // it has run out
  e.handle_events();
  REQUIRE(receive->state == ud::op_status::done);
  CHECK(receive->failure == gw::errc::peer_lost);
  CHECK_THAT(receive->message, Contains("rank 0: rank 0 has finished (said goodbye) and will send nothing more"));
  e.forget(*receive);
}

TEST_CASE("ucx: an operation UCX failed without a reason is described by the rank's failure once the rank has "
          "failed, else by its peer's loss, else as itself",
          "[transport][ucx]") {
  // A send UCX completes with an error status gets no text of its own (send.ipp): its wait
  // describes it. Engine read by hand: one rank, its own peer, the op finished as UCX's
  // callback finishes it.
  auto engine = joined_engine_of_one_rank();
  auto& e = *engine;
  std::vector<std::byte> out(8);
  auto send = e.make_op(true, 0, 5, out.data(), out.size());
  send->finish(gw::errc::peer_lost, "");
  CHECK_THAT(e.failure_text(*send), Contains("rank 0: ") && Contains("failed"));
  e.peers[0].state.lost_reason = "rank 0: lost rank 0: its endpoint failed";
  CHECK(e.failure_text(*send) == "rank 0: lost rank 0: its endpoint failed");
  e.fail_everything(gw::errc::config, "rank 0: rank 3 failed: the job's setting is bad");
  CHECK(e.failure_text(*send) == "rank 0: rank 3 failed: the job's setting is bad");  // the root cause first
}

TEST_CASE("ucx: when a peer that said goodbye breaks, only the sends to it are settled", "[transport][ucx]") {
  // Settling a send waits (up to 2 s) until UCX lets go of it: right for the sends to the
  // peer that broke (its endpoint closes), a stall for a send to a live peer that has not
  // posted its receive. Engine read by hand: one rank, its own peer; one send stands for a
  // send to another rank.
  auto engine = joined_engine_of_one_rank();
  auto& e = *engine;
  std::vector<std::byte> a(8), b(8), c(8);
  auto to_it = e.make_op(true, 0, 5, a.data(), a.size());
  auto to_another = e.make_op(true, 0, 6, b.data(), b.size());
  to_another->peer = 1;
  auto from_it = e.make_op(false, 0, 7, c.data(), c.size());
  e.in_flight = {to_another.get(), from_it.get(), to_it.get()};
  CHECK(e.sends_to(0) == std::vector<ud::ucx_op*>{to_it.get()});
  CHECK(e.sends_to(1) == std::vector<ud::ucx_op*>{to_another.get()});
  e.in_flight.clear();  // nothing of these is in UCX
}

TEST_CASE("ucx: a wait past the stall timeout fails with timeout naming the rank it waits for, and that rank hears why",
          "[transport][bad_input][ucx]") {
  // Rank 1 is alive but does not call gradwire until rank 0 has given up: rank 0's receive
  // fails after stall_timeout (0.3 s), long before its 60 s deadline; rank 1's next wait
  // then fails with rank 0's reason, as a timeout (peer_failure_kind).
  const std::string token = "stall-timeout-over-ucx";
  gw::observe::current_step() = 0;  // the process's step: an earlier case run in this process trained
  gw::rendezvous::store_server store("127.0.0.1", 0, token);
  std::optional<std::pair<gw::errc, std::string>> at0, at1;
  std::chrono::steady_clock::duration waited0{};
  std::mutex mutex;
  std::condition_variable changed;
  bool gave_up = false;
  std::exception_ptr other;  // a rank's unexpected failure (the join's), rethrown below
  auto rank = [&](int r) {
    try {
      gw::transport::ucx_options o;
      o.rank = r;
      o.size = 2;
      o.job_token = token;
      o.store_port = store.port();
      o.serve_store = false;
      o.connect_timeout = std::chrono::seconds(60);
      o.stall_timeout = std::chrono::milliseconds(300);
      gw::transport::ucx t(o);
      std::byte one{};
      if (r == 1) {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, std::chrono::seconds(60), [&] { return gave_up; });
      }
      auto receive = t.async_recv(1 - r, 5, {&one, 1});
      const auto began = std::chrono::steady_clock::now();
      try {
        t.wait(receive, gw::clock::now() + std::chrono::seconds(60));
      } catch (const gw::error& e) {
        (r == 0 ? at0 : at1).emplace(e.kind(), e.what());
      }
      if (r == 0) {
        waited0 = std::chrono::steady_clock::now() - began;
        std::lock_guard lock(mutex);
        gave_up = true;
        changed.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      other = std::current_exception();
      gave_up = true;
      changed.notify_all();
    }
  };
  {
    std::jthread rank1(rank, 1);
    rank(0);
  }
  if (other) std::rethrow_exception(other);
  REQUIRE(at0);
  CAPTURE(at0->second);
  CHECK(at0->first == gw::errc::timeout);
  CHECK_THAT(at0->second, Contains("rank 1 stalled (gave up after GRADWIRE_STALL_TIMEOUT=0.3 s): rank 0: waited ") &&
                              Contains(" s in a transport wait (operation #0, step 0) for rank 1: it is alive as far "
                                       "as UCX can tell but has not answered"));
  CHECK(waited0 < std::chrono::seconds(20));
  REQUIRE(at1);
  CAPTURE(at1->second);
  CHECK(at1->first == gw::errc::timeout);
  CHECK_THAT(at1->second, Contains("rank 1: rank 0 failed: rank 1 stalled (gave up after GRADWIRE_STALL_TIMEOUT"));
}

TEST_CASE("ucx: a rank that publishes its address but never answers the greeting is named by the join's timeout",
          "[transport][bad_input][ucx]") {
  // Rank 1 of 2 is played by the test: through the store it publishes, as its own, the address
  // rank 0 published (a real UCX worker, so rank 0's endpoint and greeting go out) and a host
  // identity, and never greets. Rank 0's greeting phase is then all that waits: its timeout
  // names rank 1 (the list the user reads), not only the deadline. (UCX warns at exit that the
  // greeting rank 0 sent to "rank 1", itself, was never matched.)
  const std::string token = "publishes-never-greets";
  gw::rendezvous::store_server store("127.0.0.1", 0, token);
  gw::transport::ucx_options o;
  o.rank = 0;
  o.size = 2;
  o.job_token = token;
  o.store_port = store.port();
  o.serve_store = false;
  o.connect_timeout = std::chrono::milliseconds(1500);
  gw::rendezvous::store_client rank1("127.0.0.1", store.port(), token, std::chrono::seconds(10));
  rank1.set(o.store_prefix + "host/1", std::string("elsewhere\nelsewhere"));
  std::optional<std::pair<gw::errc, std::string>> failure;  // read after the join below
  std::exception_ptr other;
  std::jthread rank0([&] {  // joined below, or on the way out of a failed REQUIRE
    try {
      gw::transport::ucx t(o);
    } catch (const gw::error& e) {
      failure.emplace(e.kind(), e.what());
    } catch (...) {
      other = std::current_exception();
    }
  });
  rank1.set(o.store_prefix + "1", rank1.get(o.store_prefix + "0"));
  rank0.join();
  if (other) std::rethrow_exception(other);
  REQUIRE(failure);
  CAPTURE(failure->second);
  REQUIRE(failure->first == gw::errc::timeout);
  REQUIRE_THAT(failure->second, Contains("rank 0: ranks 1 did not connect within 1500 ms"));
}
#endif
