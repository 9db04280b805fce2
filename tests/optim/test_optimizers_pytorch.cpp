// Optimizers against torch.optim (SGD, SGD with momentum / Nesterov, Adam, AdamW): trajectories PyTorch computed.
//
// The `trajectory` constants are what PyTorch 1.13's torch.optim made in float64 from the
// parameters p0 and the gradients g below over 4 steps: the parameters after each step and
// the optimizer state after the last (momentum_buffer; exp_avg, exp_avg_sq). The script
// that printed them is at the end of this file (run it with /usr/bin/python3, which has
// Debian's python3-torch). The inputs are dyadic, so float holds them exactly and every
// difference left is the rounding of the arithmetic. Each case also runs with grad_scale
// 0.5 and 0.25 on gradients 2x and 4x as large: the scale (the 1/N of averaging) multiplies
// the gradient only, so PyTorch's numbers must come out again.
#include <gradwire/optim/adam.hpp>
#include <gradwire/optim/momentum.hpp>
#include <gradwire/optim/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

namespace {

namespace optim = gradwire::optim;

constexpr std::size_t n = 6;
constexpr std::size_t steps = 4;

struct trajectory {
  double params[steps][n];  // after each step
  double state[2][n];       // the optimizer's buffers after the last step, in PyTorch's order
};

constexpr double p0[n] = {0.5, -1.25, 2.0, -0.75, 0.125, 0.0};
constexpr double g[steps][n] = {{0.25, -0.5, 1.0, 0.125, -2.0, 0.0},
                                {-0.375, 0.75, 0.5, -1.5, 1.0, 0.25},
                                {0.5, 0.25, -1.25, 0.0625, 0.5, -0.5},
                                {1.5, -0.125, 0.25, -0.25, -0.75, 1.0}};
constexpr double decay[steps] = {0.1, 0.1, 0.05, 0.025};  // an lr schedule: set_lr before each step

// --- printed by the script at the end of this file ---
// torch.optim.SGD(lr=0.1)
constexpr trajectory sgd{
    .params = {{0.475, -1.2, 1.9,
                -0.7625, 0.325, 0.0},
               {0.5125, -1.275, 1.8499999999999999,
                -0.6124999999999999, 0.225, -0.025},
               {0.46249999999999997, -1.2999999999999998, 1.9749999999999999,
                -0.6187499999999999, 0.175, 0.025},
               {0.31249999999999994, -1.2874999999999999, 1.95,
                -0.5937499999999999, 0.25, -0.07500000000000001}},
    .state = {}};
// torch.optim.SGD(lr=0.1, weight_decay=0.01)
constexpr trajectory sgd_weight_decay{
    .params = {{0.4745, -1.19875, 1.898,
                -0.76175, 0.324875, 0.0},
               {0.5115255, -1.27255125, 1.846102,
                -0.61098825, 0.22455012500000002, -0.025},
               {0.4610139745, -1.2962786987500001, 1.969255898,
                -0.61662726175, 0.174325574875, 0.025025},
               {0.31055296052549997, -1.2824824200512501, 1.942286642102,
                -0.5910106344882501, 0.249151249300125, -0.075000025}},
    .state = {}};
// torch.optim.SGD(lr=0.1, momentum=0.9)
constexpr trajectory momentum{
    .params = {{0.475, -1.2, 1.9,
                -0.7625, 0.325, 0.0},
               {0.49, -1.23, 1.76,
                -0.6237499999999999, 0.405, -0.025},
               {0.4535, -1.282, 1.759,
                -0.5051249999999999, 0.42700000000000005, 0.0025000000000000022},
               {0.27065, -1.3163, 1.7330999999999999,
                -0.37336249999999993, 0.5218, -0.07275}},
    .state = {{1.8285, 0.343, 0.259,
               -1.317625, -0.9480000000000001, 0.7525}}};
// torch.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)
constexpr trajectory nesterov_weight_decay{
    .params = {{0.473875, -1.1965625, 1.8955,
                -0.7583125, 0.31440625, 0.0},
               {0.49611159374999997, -1.239347578125, 1.794446375,
                -0.6157542656249999, 0.2986596953125, -0.02375},
               {0.4504592168046875, -1.2646595130664062, 1.84048936721875,
                -0.5596707250507812, 0.28127657660351557, 0.013737812500000002},
               {0.28834864736002147, -1.2610966538773876, 1.7972232400650858,
                -0.48136004968764934, 0.3587176903410161, -0.070141848359375}},
    .state = {{1.9107649200589845, 0.12997310208105473, 0.5814423052359375,
               -1.4313666344556641, -0.9032067817557617, 0.7521181406249999}}};
// torch.optim.SGD(lr=0.1, momentum=0.5, weight_decay=0.1), lr per step [0.1, 0.1, 0.05, 0.025]
constexpr trajectory momentum_schedule{
    .params = {{0.47, -1.1875, 1.88,
                -0.755, 0.32375000000000004, 0.0},
               {0.48779999999999996, -1.219375, 1.7511999999999999,
                -0.59995, 0.31988750000000005, -0.025},
               {0.464811, -1.233746875, 1.7727439999999999,
                -0.56131275, 0.29232243750000003, -0.006125000000000003},
               {0.42040172249999996, -1.2311304765625, 1.76744814,
                -0.544000155625, 0.30345036578125, -0.026390937500000003}},
    .state = {{1.7763711, -0.10465593749999999, 0.21183439999999992,
               -0.692503775, -0.44511713124999996, 0.8106375}}};
// torch.optim.Adam(lr=0.001)
constexpr trajectory adam_defaults{
    .params = {{0.49900000004, -1.24900000002, 1.9990000000099999,
                -0.75099999992, 0.125999999995, 0.0},
               {0.49924770184836237, -1.249247701832248, 1.9980678203829816,
                -0.7503140486456414, 0.12626633703297568, -0.0007441367814827741},
               {0.4989012161646121, -1.2496030362202721, 1.9980640097107696,
                -0.749810779081469, 0.12632772589530328, -0.0004298506217227343},
               {0.4982548305440818, -1.249814478253478, 1.9979751642251529,
                -0.7493088750829383, 0.12655651295165196, -0.0008116110885909797}},
    .state = {{0.18284999999999996, 0.0343, 0.025899999999999996,
               -0.13176249999999995, -0.0948, 0.07524999999999998},
              {0.0027024065780625025, 0.0008886888122500008, 0.0028699407490000023,
               0.0023274827656093768, 0.005798262996000005, 0.0013121250625000012}}};
// torch.optim.Adam(lr=0.1, betas=(0.8, 0.99), eps=0.001, weight_decay=0.1), lr per step [0.1, 0.1, 0.05, 0.025]
constexpr trajectory adam_l2_schedule{
    .params = {{0.4003322259136213, -1.1501597444089458, 1.9000832639467111,
                -0.8480392156862745, 0.22494971083731458, 0.0},
               {0.41686849569070616, -1.1620435388905195, 1.806408238591398,
                -0.7717519994256468, 0.24491503616278146, -0.07793101454386914},
               {0.39349509580121034, -1.1715721680403517, 1.8013249058852305,
                -0.7437907973694612, 0.24382230404355998, -0.05876587263775602},
               {0.37450314771711485, -1.17068580724314, 1.7953871922031892,
                -0.7299142428764797, 0.24854876326839676, -0.06975346868544144}},
    .state = {{0.38238405033876977, -0.009746184711489856, 0.12613009571368483,
               -0.2649587498989838, -0.13384555704180665, 0.14957778631454294},
              {0.0285738412661304, 0.00850566365626554, 0.03180975148413726,
               0.025694833035193064, 0.056563848269339995, 0.013048129052961373}}};
// torch.optim.AdamW(lr=0.001)
constexpr trajectory adamw_defaults{
    .params = {{0.49899500004, -1.24898750002, 1.99898000001,
                -0.7509924999200001, 0.125998749995, 0.0},
               {0.499237711898362, -1.2492227119572479, 1.9980278305829817,
                -0.7502990387206423, 0.12626382704547573, -0.0007441367814827741},
               {0.49888623383749275, -1.2495655541181525, 1.998004039632464,
                -0.7497882661660826, 0.12632395326953288, -0.0004298431803549195},
               {0.49823485935462414, -1.249764500495817, 1.9978952141064512,
                -0.7492788642848903, 0.12655147708634887, -0.0008115993487913613}},
    .state = {{0.18284999999999996, 0.0343, 0.025899999999999996,
               -0.13176249999999995, -0.0948, 0.07524999999999998},
              {0.0027024065780625025, 0.0008886888122500008, 0.0028699407490000023,
               0.0023274827656093768, 0.005798262996000005, 0.0013121250625000012}}};
// torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.5), lr per step [0.1, 0.1, 0.05, 0.025]
constexpr trajectory adamw_schedule{
    .params = {{0.3750000039999998, -1.087500002, 1.800000001,
                -0.8124999920000006, 0.21874999950000001, 0.0},
               {0.38102018463623744, -1.0578951831248269, 1.6167820382481608,
                -0.7032798649641432, 0.23444620332256846, -0.0744136781482774},
               {0.3541703958328178, -1.0492145229479073, 1.5761719536813559,
                -0.6605343901314163, 0.23165449135588437, -0.056839028206568484},
               {0.33358362537165126, -1.041385392241204, 1.5542486671199196,
                -0.6397301102915063, 0.2344784866226532, -0.06567255202569251}},
    .state = {{0.18284999999999996, 0.0343, 0.025899999999999996,
               -0.13176249999999995, -0.0948, 0.07524999999999998},
              {0.0027024065780625025, 0.0008886888122500008, 0.0028699407490000023,
               0.0023274827656093768, 0.005798262996000005, 0.0013121250625000012}}};
// --- end of the script's output ---

// What is left is rounding, relative to max(1, |value|): measured at most 3.3e-16 in double
// and 8.5e-7 in float (operations fused or ordered differently from PyTorch's); the
// tolerances leave 30x and 12x of room.
template <class T>
constexpr double tolerance = sizeof(T) == sizeof(double) ? 1e-14 : 1e-5;

template <class T>
void require_matches(std::span<const T> got, const double (&want)[n], const char* what) {
  REQUIRE(got.size() == n);
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(what, i, got[i], want[i]);
    REQUIRE(std::abs(double(got[i]) - want[i]) <= tolerance<T> * std::max(1.0, std::abs(want[i])));
  }
}

// Runs `opt` over the 4 steps (with the lr schedule when `lrs` is given) and compares with PyTorch.
template <class T, class Optimizer>
void check(Optimizer opt, const trajectory& want, const double* lrs = nullptr) {
  for (const double scale : {1.0, 0.5, 0.25}) {
    CAPTURE(Optimizer::name, scale);
    auto state = opt.template init<T>(n);
    std::vector<T> params(std::begin(p0), std::end(p0));
    for (std::size_t t = 0; t < steps; ++t) {
      CAPTURE(t + 1);
      if (lrs != nullptr) opt.set_lr(lrs[t]);
      std::vector<T> grads(n);
      for (std::size_t i = 0; i < n; ++i) grads[i] = T(g[t][i] / scale);  // exact: dyadic
      opt.step(state, std::span<T>(params), std::span<const T>(grads), T(scale));
      require_matches<T>(params, want.params[t], "parameters");
    }
    std::size_t buffer = 0;
    state.for_each_buffer([&](std::span<T> b) {
      REQUIRE(buffer < 2);
      require_matches<T>(b, want.state[buffer++], "state buffer");
    });
    state.for_each_counter([&](long count) { REQUIRE(count == long(steps)); });  // Adam's step, as PyTorch's
  }
}

}  // namespace

TEMPLATE_TEST_CASE("optim::sgd matches torch.optim.SGD (with and without weight_decay)", "[optim][sgd][pytorch]",
                   float, double) {
  using T = TestType;
  check<T>(optim::sgd({.lr = 0.1}), sgd);
  check<T>(optim::sgd({.lr = 0.1, .weight_decay = 0.01}), sgd_weight_decay);
}

TEMPLATE_TEST_CASE("optim::momentum matches torch.optim.SGD with momentum, nesterov and weight_decay",
                   "[optim][momentum][pytorch]", float, double) {
  using T = TestType;
  check<T>(optim::momentum({.lr = 0.1, .momentum = 0.9}), momentum);
  check<T>(optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.05}),
           nesterov_weight_decay);
  check<T>(optim::momentum({.lr = 0.1, .momentum = 0.5, .weight_decay = 0.1}), momentum_schedule, decay);
}

TEMPLATE_TEST_CASE("optim::adam matches torch.optim.Adam (defaults, and L2 weight_decay with an lr schedule)",
                   "[optim][adam][pytorch]", float, double) {
  using T = TestType;
  check<T>(optim::adam{}, adam_defaults);  // gradwire's defaults are PyTorch's
  check<T>(optim::adam({.lr = 0.1, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.1}),
           adam_l2_schedule, decay);
}

TEMPLATE_TEST_CASE("optim::adamw matches torch.optim.AdamW (defaults, and decoupled decay with an lr schedule)",
                   "[optim][adamw][pytorch]", float, double) {
  using T = TestType;
  check<T>(optim::adamw{}, adamw_defaults);  // weight_decay 1e-2, as PyTorch's
  check<T>(optim::adamw({.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.5}),
           adamw_schedule, decay);
}

// The script that printed the trajectories above (PyTorch 1.13, Debian 12's python3-torch):
//
// # Reference values for tests/optim/test_optimizers_pytorch.cpp (run with /usr/bin/python3, PyTorch 1.13).
// import torch
//
// P0 = [0.5, -1.25, 2.0, -0.75, 0.125, 0.0]
// G = [[0.25, -0.5, 1.0, 0.125, -2.0, 0.0],
//      [-0.375, 0.75, 0.5, -1.5, 1.0, 0.25],
//      [0.5, 0.25, -1.25, 0.0625, 0.5, -0.5],
//      [1.5, -0.125, 0.25, -0.25, -0.75, 1.0]]
// DECAY = [0.1, 0.1, 0.05, 0.025]  # an lr schedule: set before each step
// CASES = [  # name, optimizer, its options, lr per step (None: constant)
//     ("sgd", torch.optim.SGD, dict(lr=0.1), None),
//     ("sgd_weight_decay", torch.optim.SGD, dict(lr=0.1, weight_decay=0.01), None),
//     ("momentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9), None),
//     ("nesterov_weight_decay", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05), None),
//     ("momentum_schedule", torch.optim.SGD, dict(lr=0.1, momentum=0.5, weight_decay=0.1), DECAY),
//     ("adam_defaults", torch.optim.Adam, dict(lr=1e-3), None),
//     ("adam_l2_schedule", torch.optim.Adam, dict(lr=0.1, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1), DECAY),
//     ("adamw_defaults", torch.optim.AdamW, dict(lr=1e-3), None),
//     ("adamw_schedule", torch.optim.AdamW, dict(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5), DECAY),
// ]
//
// def row(values, indent):  # three numbers a line
//     text = [repr(float(v)) for v in values]
//     lines = [", ".join(text[i:i + 3]) for i in range(0, len(text), 3)]
//     return "{" + (",\n" + " " * (indent + 1)).join(lines) + "}"
//
// for name, make, options, lrs in CASES:
//     p = torch.tensor(P0, dtype=torch.float64, requires_grad=True)
//     opt = make([p], **options)
//     after = []
//     for t, g in enumerate(G):
//         if lrs is not None:
//             opt.param_groups[0]["lr"] = lrs[t]
//         p.grad = torch.tensor(g, dtype=torch.float64)
//         opt.step()
//         after.append(p.detach().tolist())
//     state = opt.state[p]
//     buffers = [state[k].tolist() for k in ("momentum_buffer", "exp_avg", "exp_avg_sq") if state.get(k) is not None]
//     print(f"// torch.optim.{make.__name__}({', '.join(f'{k}={v}' for k, v in options.items())})"
//           + (f", lr per step {lrs}" if lrs else ""))
//     print(f"constexpr trajectory {name}{{")
//     print("    .params = {" + ",\n               ".join(row(a, 15) for a in after) + "},")
//     print("    .state = {" + ",\n              ".join(row(b, 14) for b in buffers) + "}};")
