// K of N's step time against plain all-reduce, with and without a straggler, across processes over asio_tcp or ucx.
//
//   gradwire-run -n 4 k_of_n --bytes 4M --compute-ms 20 --straggler 1:3 --steps 30 --rounds 5 [--transport ucx]
//
// All ranks plan the round's steps (plan_steps: a late rank's communicator thread may run
// ahead through them). Each step: the step opens (begin_step: the close watch listens from
// here), the replica "computes" by sleeping --compute-ms (a slow rank FACTOR times as long),
// marks its one gradient of --bytes and finishes; a late rank's finish may apply several
// steps, and its loop skips them. Seven cases, interleaved round by round (the machine is
// noisy): plain all-reduce and K of N with one backup, each with nobody slow, with RANK slow
// in every step, and with a different rank slow each step; and the elastic all-reduce
// (aggregation::elastic_all_reduce, which shrinks past a loss) with nobody slow: the price of
// being able to lose a rank when none is lost. Per case: the median over rounds
// of a round's time per step (rank 0's clock, from a barrier before the first step to one
// after the last: the job's pace), the gradients rank 0 had dropped, and the ratios the
// issue's targets name. Rank 0 prints the table and writes --csv.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <gradwire/aggregation/elastic_all_reduce.hpp>
#include <gradwire/asio.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/gradwire.hpp>
#if GRADWIRE_HAS_UCX
#include <gradwire/ucx.hpp>
#endif
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gw = gradwire;

namespace {

struct options {
  std::size_t bytes = 4 << 20;
  double compute_ms = 20;
  int straggler_rank = 1;
  double straggler_factor = 3;
  int steps = 30, rounds = 5;
  std::string transport = "tcp", csv;
};

std::size_t parse_bytes(const std::string& text) {
  std::size_t at = 0;
  const double v = std::stod(text, &at);
  const std::string unit = text.substr(at);
  const double scale = unit == "K" ? 1024.0 : unit == "M" ? 1024.0 * 1024 : unit == "G" ? 1024.0 * 1024 * 1024 : 1.0;
  return static_cast<std::size_t>(v * scale);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--bytes") o.bytes = parse_bytes(next());
    else if (flag == "--compute-ms") o.compute_ms = std::stod(next());
    else if (flag == "--straggler") {
      const std::string v = next();
      const auto colon = v.find(':');
      if (colon == std::string::npos) throw std::invalid_argument("--straggler expects RANK:FACTOR");
      o.straggler_rank = std::stoi(v.substr(0, colon));
      o.straggler_factor = std::stod(v.substr(colon + 1));
    } else if (flag == "--steps") o.steps = std::stoi(next());
    else if (flag == "--rounds") o.rounds = std::stoi(next());
    else if (flag == "--transport") o.transport = next();
    else if (flag == "--csv") o.csv = next();
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return o;
}

struct outcome {
  double median_step_ms = 0;
  std::uint64_t dropped = 0;  // this rank's, over the round
};

// Who is slow in a step: nobody, always the same rank, or a different rank each step (the
// same draw on every rank: Chen et al.'s stragglers come and go).
enum class slowness { none, one_rank, rotating };

template <class Transport>
outcome run_case(Transport& transport, const options& o, int backups, slowness straggling, std::uint64_t seed) {
  using strategy_type = gw::strategy<gw::tensor_view<float>, gw::optim::sgd, gw::aggregation::all_reduce, Transport>;
  std::vector<float> param(o.bytes / sizeof(float), 0.0f), grad(param.size(), 1e-3f);
  std::vector<gw::tensor_view<float>> params{gw::tensor_view<float>(param.data(), gw::shape{param.size()})};
  strategy_type s(std::move(transport), params, gw::optim::sgd({.lr = 0.01}),
                  gw::aggregation::all_reduce(gw::aggregation::all_reduce_options{.backup_workers = backups}));
  gw::collective::barrier(s.communicator());
  s.aggregation().plan_steps(static_cast<std::uint64_t>(o.steps));  // K of N: a late rank's thread runs ahead
  const auto started = gw::clock::now();
  for (int k = 0; k < o.steps;) {
    const int slow_rank = straggling == slowness::none       ? -1
                          : straggling == slowness::one_rank ? o.straggler_rank
                                                             : static_cast<int>((seed * 0x9e3779b97f4a7c15ULL + std::uint64_t(k) * 0xbf58476d1ce4e5b9ULL) >> 33) % s.size();
    const auto compute =
        std::chrono::duration<double, std::milli>(o.compute_ms * (s.rank() == slow_rank ? o.straggler_factor : 1.0));
    auto step = s.begin_step();
    std::this_thread::sleep_for(compute);
    step.ready(0, grad);
    step.finish();
    k += static_cast<int>(s.aggregation().last_steps_advanced());  // a late rank skips the steps it missed
  }
  gw::collective::barrier(s.communicator());  // the job's pace: every rank has done every step
  const double per_step =
      std::chrono::duration<double, std::milli>(gw::clock::now() - started).count() / double(o.steps);
  outcome out{per_step, s.cumulative_stats().dropped};
  transport = std::move(s.communicator().transport());  // the next case reuses the connections
  return out;
}

// The elastic all-reduce, nobody slow: its step reduces at finish, over the current view.
template <class Transport>
outcome run_elastic_case(Transport& transport, const options& o) {
  using strategy_type =
      gw::strategy<gw::tensor_view<float>, gw::optim::sgd, gw::aggregation::elastic_all_reduce, Transport>;
  std::vector<float> param(o.bytes / sizeof(float), 0.0f), grad(param.size(), 1e-3f);
  std::vector<gw::tensor_view<float>> params{gw::tensor_view<float>(param.data(), gw::shape{param.size()})};
  outcome out;
  {
    strategy_type s(std::move(transport), params, gw::optim::sgd({.lr = 0.01}),
                    gw::aggregation::elastic_all_reduce(gw::aggregation::elastic_options{.min_replicas = 1}));
    gw::collective::barrier(s.communicator());
    const auto started = gw::clock::now();
    for (int k = 0; k < o.steps; ++k) {
      auto step = s.begin_step();
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.compute_ms));
      step.ready(0, grad);
      step.finish();
    }
    gw::collective::barrier(s.communicator());
    out.median_step_ms = std::chrono::duration<double, std::milli>(gw::clock::now() - started).count() / double(o.steps);
    transport = std::move(s.communicator().transport());
  }
  return out;
}

template <class Transport>
int run(Transport transport, const options& o, const std::string& described) {
  const int rank = transport.rank(), size = transport.size();
  struct case_spec {
    const char* name;
    int backups;
    slowness straggling;
  };
  const case_spec cases[] = {{"all_reduce", 0, slowness::none},
                             {"K of N b=1", 1, slowness::none},
                             {"all_reduce, one slow rank", 0, slowness::one_rank},
                             {"K of N b=1, one slow rank", 1, slowness::one_rank},
                             {"all_reduce, slow rank moves", 0, slowness::rotating},
                             {"K of N b=1, slow rank moves", 1, slowness::rotating},
                             {"elastic_all_reduce", -1, slowness::none}};
  std::vector<std::vector<double>> medians(std::size(cases));
  std::vector<std::uint64_t> dropped(std::size(cases));
  for (int round = 0; round < o.rounds; ++round)
    for (std::size_t c = 0; c < std::size(cases); ++c) {
      const outcome got = cases[c].backups < 0
                              ? run_elastic_case(transport, o)
                              : run_case(transport, o, cases[c].backups, cases[c].straggling, std::uint64_t(round) + 1);
      medians[c].push_back(got.median_step_ms);
      dropped[c] += got.dropped;
    }
  if (rank != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("# K of N step time: %d ranks over %s, %zu bytes per step, compute %.1f ms, straggler rank %d x%.1f, "
              "%d steps x %d rounds, interleaved; time per step, median over rounds\n",
              size, described.c_str(), o.bytes, o.compute_ms, o.straggler_rank, o.straggler_factor, o.steps, o.rounds);
  std::printf("%-26s %12s %14s %12s\n", "case", "step ms", "vs all_reduce", "rank 0 dropped");
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    csv << "case,ranks,transport,bytes,compute_ms,straggler_factor,step_ms,ratio_to_all_reduce,rank0_dropped\n";
  }
  const double base = median(medians[0]);
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    const double m = median(medians[c]);
    std::printf("%-26s %12.2f %14.3f %12llu\n", cases[c].name, m, m / base, static_cast<unsigned long long>(dropped[c]));
    if (csv) csv << '"' << cases[c].name << "\"," << size << ',' << described << ',' << o.bytes << ',' << o.compute_ms << ','
                 << o.straggler_factor << ',' << m << ',' << m / base << ',' << dropped[c] << '\n';
  }
  std::printf("K of N without a straggler vs all_reduce: %.3f; with one slow rank, K of N vs all_reduce: %.3f; "
              "with the slow rank moving, K of N vs all_reduce: %.3f; elastic_all_reduce vs all_reduce: %.3f\n",
              median(medians[1]) / base, median(medians[3]) / median(medians[2]), median(medians[5]) / median(medians[4]),
              median(medians[6]) / base);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
#if GRADWIRE_HAS_UCX
  if (o.transport == "ucx") return run(gw::cluster::join_ucx(), o, "ucx");
#endif
  if (o.transport != "tcp") throw std::invalid_argument("--transport tcp or ucx (this build: " + o.transport + "?)");
  return run(gw::cluster::join_tcp(), o, "asio_tcp");
} catch (const std::exception& e) {
  std::fprintf(stderr, "k_of_n: %s\n", e.what());
  return 2;
}
