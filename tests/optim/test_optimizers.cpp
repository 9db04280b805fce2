// Optimizers against their textbook formulas in float64 over several steps, plus
// hyperparameter validation, size checks and the optimizer concept; optim::one_of against
// the optimizer it holds.
#include <gradwire/optim/adam.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/one_of.hpp>
#include <gradwire/optim/sgd.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "helpers/close.hpp"
#include "helpers/reference.hpp"

namespace {

namespace gt = gradwire::test;
namespace optim = gradwire::optim;
using gradwire::errc;
using gt::require_close;

static_assert(gradwire::concepts::optimizer<optim::sgd, float> && gradwire::concepts::optimizer<optim::sgd, double>);
static_assert(gradwire::concepts::optimizer<optim::momentum, float> &&
              gradwire::concepts::optimizer<optim::momentum, double>);
static_assert(gradwire::concepts::optimizer<optim::adam, float> && gradwire::concepts::optimizer<optim::adam, double>);
static_assert(gradwire::concepts::optimizer<optim::adamw, float> &&
              gradwire::concepts::optimizer<optim::adamw, double>);

constexpr std::array<std::size_t, 5> sizes{0, 1, 7, 1000, 4099};
constexpr int steps = 6;

// 1/N of averaging over N = 1, 4, 3 ranks, and an arbitrary loss scale.
template <class T>
T grad_scale(int step) {
  constexpr std::array<double, 4> scales{1.0, 0.25, 1.0 / 3.0, 2.5};
  return static_cast<T>(scales[static_cast<std::size_t>(step) % scales.size()]);
}

}  // namespace

TEMPLATE_TEST_CASE("optim::sgd follows p -= lr*(s*g + wd*p) over several steps", "[optim][sgd]", float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  const std::vector<optim::sgd_options> configs{{0.1, 0.0}, {0.05, 0.01}, {0.5, 0.3}};
  for (const auto& o : configs)
    for (const std::size_t n : sizes) {
      CAPTURE(o.lr, o.weight_decay, n);
      const optim::sgd opt(o);
      auto state = opt.init<T>(n);
      auto params = rng.vector<T>(n);
      auto want = gt::exact<T>(std::span<const T>(params));
      // The optimizer hands the kernels T(lr), T(wd): the reference starts from those.
      const gt::sgd_hyper h{gt::as<T>(o.lr), gt::as<T>(o.weight_decay)};
      for (int t = 1; t <= steps; ++t) {
        const T s = grad_scale<T>(t);
        CAPTURE(t, s);
        const auto grads = rng.vector<T>(n);
        opt.step(state, std::span<T>(params), std::span<const T>(grads), s);
        for (std::size_t i = 0; i < n; ++i) gt::sgd_reference_step(want[i], grads[i], s, h, gt::roundoff<T>);
        require_close<T>(params, want);
      }
    }
}

TEMPLATE_TEST_CASE("optim::momentum follows PyTorch's (Nesterov) momentum over several steps", "[optim][momentum]",
                   float, double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  const std::vector<optim::momentum_options> configs{
      {0.01, 0.9, false, 0.0}, {0.01, 0.9, true, 0.0}, {0.1, 0.5, false, 0.05}, {0.1, 0.99, true, 0.05},
      {0.05, 0.0, true, 0.01}};
  for (const auto& o : configs)
    for (const std::size_t n : sizes) {
      CAPTURE(o.lr, o.momentum, o.nesterov, o.weight_decay, n);
      const optim::momentum opt(o);
      auto state = opt.init<T>(n);
      REQUIRE(state.velocity.size() == n);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(state.velocity.data()[i] == T(0));  // velocity starts at 0
      auto params = rng.vector<T>(n);
      auto want_p = gt::exact<T>(std::span<const T>(params));
      std::vector<gt::bounded> want_v(n);
      const gt::momentum_hyper h{gt::as<T>(o.lr), gt::as<T>(o.momentum), gt::as<T>(o.weight_decay), o.nesterov};
      for (int t = 1; t <= steps; ++t) {
        const T s = grad_scale<T>(t);
        CAPTURE(t, s);
        const auto grads = rng.vector<T>(n);
        opt.step(state, std::span<T>(params), std::span<const T>(grads), s);
        for (std::size_t i = 0; i < n; ++i)
          gt::momentum_reference_step(want_p[i], want_v[i], grads[i], s, h, gt::roundoff<T>);
        require_close<T>(params, want_p);
        require_close<T>(std::as_const(state.velocity).span(), want_v);
      }
    }
}

namespace {

// Adam or AdamW, run for `steps` steps and checked after each against adam_reference_step.
template <class T, class Adam>
void check_adam_family(gt::random_engine& rng, const typename Adam::options& o, bool decoupled) {
  for (const std::size_t n : sizes) {
    CAPTURE(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, n);
    const Adam opt(o);
    auto state = opt.template init<T>(n);
    REQUIRE(state.step == 0);
    REQUIRE(state.m.size() == n);
    REQUIRE(state.v.size() == n);
    for (std::size_t i = 0; i < n; ++i) REQUIRE((state.m.data()[i] == T(0) && state.v.data()[i] == T(0)));
    auto params = rng.vector<T>(n);
    auto want_p = gt::exact<T>(std::span<const T>(params));
    std::vector<gt::bounded> want_m(n), want_v(n);
    const gt::adam_hyper h{gt::as<T>(o.lr),  gt::as<T>(o.beta1),        gt::as<T>(o.beta2),
                           gt::as<T>(o.eps), gt::as<T>(o.weight_decay), decoupled};
    for (long t = 1; t <= steps; ++t) {
      const T s = grad_scale<T>(static_cast<int>(t));
      CAPTURE(t, s);
      const auto grads = rng.vector<T>(n);
      opt.step(state, std::span<T>(params), std::span<const T>(grads), s);
      REQUIRE(state.step == t);
      for (std::size_t i = 0; i < n; ++i)
        gt::adam_reference_step(want_p[i], want_m[i], want_v[i], grads[i], s, h, t, gt::roundoff<T>);
      require_close<T>(params, want_p);
      require_close<T>(std::as_const(state.m).span(), want_m);
      require_close<T>(std::as_const(state.v).span(), want_v);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("optim::adam follows Adam with L2 weight decay over several steps", "[optim][adam]", float,
                   double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  REQUIRE(optim::adam{}.settings().weight_decay == 0.0);  // PyTorch's default
  for (const optim::adam::options o : {optim::adam::options{},                               // defaults
                                       optim::adam::options{0.05, 0.8, 0.99, 1e-3, 0.1},     // L2 decay
                                       optim::adam::options{0.01, 0.0, 0.5, 0.1, 0.01}})  // beta1 = 0, large eps
    check_adam_family<T, optim::adam>(rng, o, false);
}

TEMPLATE_TEST_CASE("optim::adamw follows AdamW (decoupled weight decay) over several steps", "[optim][adamw]", float,
                   double) {
  using T = TestType;
  GRADWIRE_TEST_RNG(rng);
  REQUIRE(optim::adamw{}.settings().weight_decay == 0.01);  // PyTorch's default
  for (const optim::adamw::options o : {optim::adamw::options{},                             // defaults, wd = 1e-2
                                        optim::adamw::options{0.1, 0.9, 0.999, 1e-8, 0.5},  // strong decay
                                        optim::adamw::options{0.02, 0.5, 0.9, 1e-2, 0.0}})  // no decay
    check_adam_family<T, optim::adamw>(rng, o, true);
}

TEST_CASE("optim::set_lr changes the rate the next step uses", "[optim][set_lr]") {
  GRADWIRE_TEST_RNG(rng);
  constexpr std::size_t n = 33;
  auto params = rng.vector<double>(n);
  const auto grads = rng.vector<double>(n);
  auto want = gt::exact<double>(std::span<const double>(params));
  optim::sgd opt({0.1, 0.0});
  opt.set_lr(0.25);
  REQUIRE(opt.settings().lr == 0.25);
  auto state = opt.init<double>(n);
  opt.step(state, std::span<double>(params), std::span<const double>(grads), 1.0);
  for (std::size_t i = 0; i < n; ++i) gt::sgd_reference_step(want[i], grads[i], 1.0, {0.25, 0.0}, gt::roundoff<double>);
  require_close<double>(params, want);
}

namespace {

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
constexpr double infinity = std::numeric_limits<double>::infinity();

// The error names the optimizer and the parameter, as "<optimizer>: <name> = <value>".
gt::error_matcher rejects(const std::string& optimizer, const std::string& parameter) {
  return gt::is_error(errc::invalid_argument, {optimizer + ": ", parameter + " = "});
}

template <class Options, class Edit>
Options with(Edit edit) {
  Options o;
  edit(o);
  return o;
}

}  // namespace

TEST_CASE("optimizers reject invalid hyperparameters, naming the parameter", "[optim][validate]") {
  using sgd_o = optim::sgd::options;
  using mom_o = optim::momentum::options;
  using adam_o = optim::adam::options;
  using adamw_o = optim::adamw::options;

  SECTION("sgd") {
    for (const double bad : {-1.0, -1e-12, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::sgd(with<sgd_o>([&](sgd_o& o) { o.lr = bad; })), gradwire::error,
                             rejects("sgd", "lr"));
      REQUIRE_THROWS_MATCHES(optim::sgd(with<sgd_o>([&](sgd_o& o) { o.weight_decay = bad; })), gradwire::error,
                             rejects("sgd", "weight_decay"));
    }
    REQUIRE_NOTHROW(optim::sgd(sgd_o{0.0, 0.0}));  // zero is allowed for both
  }
  SECTION("momentum") {
    for (const double bad : {-1.0, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::momentum(with<mom_o>([&](mom_o& o) { o.lr = bad; })), gradwire::error,
                             rejects("momentum", "lr"));
      REQUIRE_THROWS_MATCHES(optim::momentum(with<mom_o>([&](mom_o& o) { o.weight_decay = bad; })),
                             gradwire::error, rejects("momentum", "weight_decay"));
    }
    for (const double bad : {1.0, 1.5, -0.1, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::momentum(with<mom_o>([&](mom_o& o) { o.momentum = bad; })), gradwire::error,
                             rejects("momentum", "momentum"));
    }
    REQUIRE_NOTHROW(optim::momentum(mom_o{0.0, 0.0, true, 0.0}));
    REQUIRE_NOTHROW(optim::momentum(mom_o{0.1, 0.999, false, 0.1}));
  }
  SECTION("adam and adamw") {
    for (const double bad : {-1.0, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::adam(with<adam_o>([&](adam_o& o) { o.lr = bad; })), gradwire::error,
                             rejects("adam", "lr"));
      REQUIRE_THROWS_MATCHES(optim::adamw(with<adamw_o>([&](adamw_o& o) { o.lr = bad; })), gradwire::error,
                             rejects("adamw", "lr"));
      REQUIRE_THROWS_MATCHES(optim::adam(with<adam_o>([&](adam_o& o) { o.weight_decay = bad; })), gradwire::error,
                             rejects("adam", "weight_decay"));
      REQUIRE_THROWS_MATCHES(optim::adamw(with<adamw_o>([&](adamw_o& o) { o.weight_decay = bad; })),
                             gradwire::error, rejects("adamw", "weight_decay"));
    }
    for (const double bad : {1.0, 1.5, -0.1, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::adam(with<adam_o>([&](adam_o& o) { o.beta1 = bad; })), gradwire::error,
                             rejects("adam", "beta1"));
      REQUIRE_THROWS_MATCHES(optim::adam(with<adam_o>([&](adam_o& o) { o.beta2 = bad; })), gradwire::error,
                             rejects("adam", "beta2"));
      REQUIRE_THROWS_MATCHES(optim::adamw(with<adamw_o>([&](adamw_o& o) { o.beta1 = bad; })), gradwire::error,
                             rejects("adamw", "beta1"));
      REQUIRE_THROWS_MATCHES(optim::adamw(with<adamw_o>([&](adamw_o& o) { o.beta2 = bad; })), gradwire::error,
                             rejects("adamw", "beta2"));
    }
    for (const double bad : {0.0, -0.0, -1e-8, not_a_number, infinity}) {
      CAPTURE(bad);
      REQUIRE_THROWS_MATCHES(optim::adam(with<adam_o>([&](adam_o& o) { o.eps = bad; })), gradwire::error,
                             rejects("adam", "eps"));
      REQUIRE_THROWS_MATCHES(optim::adamw(with<adamw_o>([&](adamw_o& o) { o.eps = bad; })), gradwire::error,
                             rejects("adamw", "eps"));
    }
    REQUIRE_NOTHROW(optim::adam(adam_o{0.0, 0.0, 0.0, 1e-30, 0.0}));  // boundaries that are allowed
    REQUIRE_NOTHROW(optim::adamw(adamw_o{1.0, 0.999999, 0.999999, 1.0, 1.0}));
  }
}

namespace {

template <class O>
void check_set_lr(O opt, const std::string& name) {
  const double before = opt.settings().lr;
  for (const double bad : {-0.5, not_a_number, infinity, -infinity}) {
    CAPTURE(bad);
    REQUIRE_THROWS_MATCHES(opt.set_lr(bad), gradwire::error, rejects(name, "lr"));
    REQUIRE(opt.settings().lr == before);  // a rejected value leaves the rate alone
  }
  opt.set_lr(0.0);
  REQUIRE(opt.settings().lr == 0.0);
  opt.set_lr(0.125);
  REQUIRE(opt.settings().lr == 0.125);
}

// A step whose spans and state disagree in length throws before touching anything.
template <class O>
void check_size_mismatch(const O& opt, const std::string& name) {
  auto state = opt.template init<float>(4);
  const auto state_before = state;
  std::vector<float> params4{1, 2, 3, 4}, params5{1, 2, 3, 4, 5};
  const std::vector<float> grads4{1, 1, 1, 1}, grads5{1, 1, 1, 1, 1};
  const auto params4_before = params4, params5_before = params5;
  const auto matcher = gt::is_error(errc::invalid_argument, {name + ": ", "must match"});
  REQUIRE_THROWS_MATCHES(opt.step(state, std::span<float>(params4), std::span<const float>(grads5), 1.0f),
                         gradwire::error, matcher);
  REQUIRE_THROWS_MATCHES(opt.step(state, std::span<float>(params5), std::span<const float>(grads4), 1.0f),
                         gradwire::error, matcher);
  REQUIRE_THROWS_MATCHES(opt.step(state, std::span<float>(params5), std::span<const float>(grads5), 1.0f),
                         gradwire::error, matcher);
  REQUIRE(params4 == params4_before);
  REQUIRE(params5 == params5_before);
  if constexpr (requires { state.step; }) REQUIRE(state.step == state_before.step);  // no step was counted
  REQUIRE_NOTHROW(opt.step(state, std::span<float>(params4), std::span<const float>(grads4), 1.0f));
}

}  // namespace

TEST_CASE("optimizers validate set_lr", "[optim][validate]") {
  check_set_lr(optim::sgd{}, "sgd");
  check_set_lr(optim::momentum{}, "momentum");
  check_set_lr(optim::adam{}, "adam");
  check_set_lr(optim::adamw{}, "adamw");
}

TEST_CASE("optimizers reject a step whose params, grads and state differ in length", "[optim][validate]") {
  check_size_mismatch(optim::sgd{}, "sgd");
  check_size_mismatch(optim::momentum{}, "momentum");
  check_size_mismatch(optim::adam{}, "adam");
  check_size_mismatch(optim::adamw{}, "adamw");
}

namespace {

using any_optimizer = optim::one_of<optim::sgd, optim::momentum, optim::adam, optim::adamw>;
static_assert(gradwire::concepts::optimizer<any_optimizer, float> &&
              gradwire::concepts::optimizer<any_optimizer, double>);

// one_of holding `plain` steps exactly as `plain` does (whose formula the cases above check),
// through changes of lr and grad_scale, and keeps the same state.
template <class T, class O>
void check_one_of_steps_as(const O& plain) {
  GRADWIRE_TEST_RNG(rng);
  for (const std::size_t n : sizes) {
    CAPTURE(O::name, n);
    O direct = plain;
    any_optimizer chosen(plain);
    REQUIRE(chosen.name() == O::name);
    REQUIRE(chosen.template holds<O>());
    REQUIRE((chosen.template get_if<optim::sgd>() != nullptr) == std::is_same_v<O, optim::sgd>);
    auto direct_state = direct.template init<T>(n);
    auto chosen_state = chosen.template init<T>(n);
    auto want = rng.vector<T>(n);
    auto got = want;
    for (int k = 0; k < steps; ++k) {
      const auto grads = rng.vector<T>(n);
      if (k == 3) {  // a schedule's set_lr reaches the chosen optimizer
        direct.set_lr(0.5 * direct.settings().lr);
        chosen.set_lr(0.5 * chosen.template get_if<O>()->settings().lr);
      }
      direct.step(direct_state, std::span<T>(want), std::span<const T>(grads), grad_scale<T>(k));
      chosen.step(chosen_state, std::span<T>(got), std::span<const T>(grads), grad_scale<T>(k));
      REQUIRE(got == want);  // bit for bit
    }
    std::vector<std::vector<T>> direct_buffers, chosen_buffers;
    std::vector<long> direct_counters, chosen_counters;
    direct_state.for_each_buffer([&](std::span<T> b) { direct_buffers.emplace_back(b.begin(), b.end()); });
    chosen_state.for_each_buffer([&](std::span<T> b) { chosen_buffers.emplace_back(b.begin(), b.end()); });
    direct_state.for_each_counter([&](long& c) { direct_counters.push_back(c); });
    chosen_state.for_each_counter([&](long& c) { chosen_counters.push_back(c); });
    REQUIRE(chosen_buffers == direct_buffers);
    REQUIRE(chosen_counters == direct_counters);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("optim::one_of steps exactly as the optimizer it holds", "[optim][one_of]", float, double) {
  check_one_of_steps_as<TestType>(optim::sgd({.lr = 0.1, .weight_decay = 0.01}));
  check_one_of_steps_as<TestType>(optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true}));
  check_one_of_steps_as<TestType>(optim::adam({.lr = 0.01, .weight_decay = 0.1}));
  check_one_of_steps_as<TestType>(optim::adamw({.lr = 0.01}));
}

TEST_CASE("optim::one_of refuses a state made for another optimizer and passes on the held one's checks",
          "[optim][one_of][validate]") {
  const any_optimizer sgd(optim::sgd{}), adam(optim::adam{});
  auto adam_state = adam.init<float>(4);
  std::vector<float> params{1, 2, 3, 4};
  const std::vector<float> grads{1, 1, 1, 1};
  REQUIRE_THROWS_MATCHES(sgd.step(adam_state, std::span<float>(params), std::span<const float>(grads), 1.0f),
                         gradwire::error, gt::is_error(errc::invalid_argument, {"one_of", "'sgd'"}));
  REQUIRE(params == std::vector<float>{1, 2, 3, 4});
  check_size_mismatch(adam, "adam");
  any_optimizer scheduled(optim::momentum{});
  REQUIRE_THROWS_MATCHES(scheduled.set_lr(-1.0), gradwire::error, rejects("momentum", "lr"));
}

namespace {

// Three steps of `opt` on the same parameters and gradients, once without grad_scale and
// once with grad_scale = 1 written out: the default is 1 (no scaling), to the bit.
template <class T, class Opt>
void check_default_scale_is_one(const Opt& opt) {
  GRADWIRE_TEST_RNG(rng);
  constexpr std::size_t n = 1000;
  auto implicit_state = opt.template init<T>(n), explicit_state = opt.template init<T>(n);
  auto implicit_params = rng.vector<T>(n);
  auto explicit_params = implicit_params;
  for (int t = 1; t <= 3; ++t) {
    CAPTURE(t);
    const auto grads = rng.vector<T>(n);
    opt.step(implicit_state, std::span<T>(implicit_params), std::span<const T>(grads));
    opt.step(explicit_state, std::span<T>(explicit_params), std::span<const T>(grads), T(1));
    REQUIRE(implicit_params == explicit_params);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("every optimizer's step without grad_scale scales the gradient by 1", "[optim]", float, double) {
  check_default_scale_is_one<TestType>(optim::sgd({.lr = 0.1, .weight_decay = 0.01}));
  check_default_scale_is_one<TestType>(optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true}));
  check_default_scale_is_one<TestType>(optim::adam({.lr = 0.01, .weight_decay = 0.1}));
  check_default_scale_is_one<TestType>(optim::adamw({.lr = 0.01}));
  check_default_scale_is_one<TestType>(any_optimizer(optim::momentum({.lr = 0.05, .momentum = 0.9})));
}
