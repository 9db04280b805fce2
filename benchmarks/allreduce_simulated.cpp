// nccl-tests-style benchmark: gradwire all_reduce (float32 sum, in place) on a simulated cluster, in virtual time.
//
//   allreduce_simulated --cluster "hosts=2 ranks_per_host=2 bandwidth=1Gbit latency=50us" --algorithm ring -b 4 -e 16M
//   allreduce_simulated --cluster-file model.txt ...   (a file of cluster_model lines)
//
// The ranks run the library's real all_reduce over transport::simulated: simulation::run
// starts one thread per rank of the model and runs them one at a time in virtual time
// (transport/simulated.hpp). Everything else is allreduce_tcp's, so that the two tables
// can be laid side by side (benchmarks/validate_simulator.sh): the same flags (-g is
// ignored: the model says the ranks), the same inputs, the same check, and the same time:
// per iteration the slowest rank's time of its own all_reduce after a barrier, the median
// over iterations, and with --repeats R the median of R such medians, here in virtual time.
// The memcpy columns are this machine's memcpy, measured after the sweep as allreduce_tcp
// does during it (a reference only: nothing simulated depends on them).
//
// Compute model: compute=modelled unless the --cluster text says compute=measured. The
// prediction is the network model's alone: the receive-and-add of the reduce-scatter
// runs inside the simulated transport's delivery, whose CPU time no rank is charged under
// either setting, so measured would add only the CPU time between transport calls (the
// collective's bookkeeping) and with it the noise of the machine the simulator runs on.
// The adds' cost on a real cluster is in the link bandwidth calibrated from a real 2-rank
// all-reduce (benchmarks/validate_simulator.sh), and a modelled run is exactly
// reproducible.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/tensor/aligned_buffer.hpp>
#include <gradwire/transport/simulated.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "algorithm_flag.hpp"
#include "bench_table.hpp"

namespace gw = gradwire;
namespace col = gradwire::collective;
namespace sim = gradwire::simulation;
namespace bench = gradwire::bench;

namespace {

// Elements of `got` in [begin, end) that differ from the float64 sum of every rank's input
// by more than float32 rounding of an n-term sum allows (allreduce_tcp's check).
long long count_wrong(std::span<const float> got, std::uint64_t seed, int n, std::size_t begin, std::size_t end) {
  long long wrong = 0;
  for (std::size_t i = begin; i < end; ++i) {
    double reference = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const double x = bench::input_value(seed, r, i);
      reference += x;
      magnitude += std::fabs(x);
    }
    wrong += !(std::fabs(double(got[i]) - reference) <= n * 0x1p-23 * magnitude);
  }
  return wrong;
}

// Takes "FLAG VALUE" out of argv (the shared parser does not know it); nullopt if absent.
std::optional<std::string> take_value_flag(int& argc, char** argv, std::string_view flag) {
  std::optional<std::string> value;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != flag) continue;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %.*s needs a value\n", argv[0], static_cast<int>(flag.size()), flag.data());
      std::exit(2);
    }
    value = argv[i + 1];
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    --i;
  }
  return value;
}

// The sweep's per-size results, filled by the ranks (each writes its own slots; the
// scheduler's hand-overs order their writes before run() returns).
struct sweep_results {
  std::vector<std::vector<std::vector<double>>> times;  // [size][rank][repeat * iters + i]: virtual seconds
  std::vector<long long> wrong;                          // [size], summed over ranks and repeats
};

sweep_results run_sweep(const sim::cluster_model& model, bench::algorithm alg, const bench::options& o,
                        const std::vector<std::size_t>& sizes) {
  const int n = model.size();
  const std::size_t max_count = sizes.empty() ? 0 : sizes.back() / sizeof(float);
  sweep_results out;
  out.times.assign(sizes.size(), std::vector<std::vector<double>>(static_cast<std::size_t>(n)));
  std::vector<std::vector<long long>> wrong(sizes.size(), std::vector<long long>(static_cast<std::size_t>(n), 0));

  sim::run(model, [&](gw::transport::simulated t) {
    col::communicator comm(std::move(t), {.timeout = std::chrono::seconds(120), .verify = o.verify_calls});
    const int me = comm.rank();
    const auto mine = static_cast<std::size_t>(me);
    gw::aligned_buffer<float> pristine(max_count), work(max_count);
    for (std::size_t i = 0; i < max_count; ++i) pristine.data()[i] = bench::input_value(o.seed, me, i);
    std::memset(work.data(), 0, max_count * sizeof(float));
    comm.template scratch<float>(max_count / static_cast<std::size_t>(n) + 1);  // as allreduce_tcp

    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t bytes = sizes[k], count = bytes / sizeof(float);
        const int iters = bench::iterations_for(bytes, o.iters), warmup = bench::warmup_for(bytes, o.warmup);
        const std::span<float> data = work.span().first(count);
        for (int it = 0; it < warmup + iters; ++it) {
          if (bytes) std::memcpy(work.data(), pristine.data(), bytes);
          col::barrier(comm);
          const sim::time_point t0 = sim::now();
          bench::run_all_reduce(alg, comm, data);
          const sim::time_point t1 = sim::now();
          if (it >= warmup) out.times[k][mine].push_back(double((t1 - t0).count()) * 1e-9);
          if (o.check && it == warmup) {
            const std::size_t slice = (count + n - 1) / n, begin = std::min(count, slice * mine);
            wrong[k][mine] += count_wrong(data, o.seed, n, begin, std::min(count, begin + slice));
          }
        }
      }
    }
    col::barrier(comm);
  });
  for (const auto& w : wrong) {
    long long sum = 0;
    for (long long x : w) sum += x;
    out.wrong.push_back(sum);
  }
  return out;
}

int run(const sim::cluster_model& model, bench::algorithm alg, bench::options o) {
  const int n = model.size();
  if (!o.seed) o.seed = 1;  // the virtual times do not depend on the inputs; a fixed seed keeps runs identical
  const std::vector<std::size_t> sizes = bench::sizes(o, sizeof(float));
  const sweep_results results = run_sweep(model, alg, o, sizes);

  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    const bool fresh = !std::filesystem::exists(o.csv);
    csv = std::fopen(o.csv.c_str(), "a");  // appended, as allreduce_tcp's
    if (!csv) {
      std::fprintf(stderr, "allreduce_simulated: cannot write %s: %s\n", o.csv.c_str(), std::strerror(errno));
      return 2;
    }
    if (fresh) std::fprintf(csv, "%s\n", bench::csv_header);
  }
  std::printf("# cluster: %s\n", sim::describe(model).c_str());
  bench::print_table_header("gradwire all_reduce (" + std::string(bench::name_of(alg)) + ") over transport::simulated, " +
                                std::to_string(n) + " simulated ranks; float32 sum in place; time = median over "
                                "iterations of the slowest rank, in virtual time",
                            o, n);
  bench::memcpy_bound bound(sizes.empty() ? 0 : sizes.back());
  std::vector<bench::row> rows;
  long long total_wrong = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const int iters = bench::iterations_for(sizes[k], o.iters);
    std::vector<double> per_repeat;
    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      std::vector<double> slowest(static_cast<std::size_t>(iters), 0.0);
      for (const auto& rank_times : results.times[k])
        for (int i = 0; i < iters; ++i)
          slowest[static_cast<std::size_t>(i)] =
              std::max(slowest[static_cast<std::size_t>(i)], rank_times[static_cast<std::size_t>(repeat * iters + i)]);
      per_repeat.push_back(bench::median(slowest));
    }
    bench::row r;
    r.bytes = sizes[k];
    r.count = sizes[k] / sizeof(float);
    r.seconds = bench::median(per_repeat);
    r.seconds_min = *std::min_element(per_repeat.begin(), per_repeat.end());
    r.seconds_max = *std::max_element(per_repeat.begin(), per_repeat.end());
    r.memcpy_seconds = bound.seconds(sizes[k], iters);
    r.bus_factor = bench::all_reduce_bus_factor(n);
    r.wrong = o.check ? results.wrong[k] : -1;
    r.iters = iters;
    r.warmup = bench::warmup_for(sizes[k], o.warmup);
    r.repeats = o.repeats;
    bench::print_row(r);
    if (csv)
      bench::write_csv_row(csv, "allreduce_simulated,simulated," + std::string(bench::name_of(alg)) + "," +
                                    std::to_string(n),
                           r);
    rows.push_back(r);
    total_wrong += results.wrong[k];
  }
  bench::print_table_footer(rows);
  if (csv) std::fclose(csv);
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::algorithm alg = bench::take_algorithm_flag(argc, argv);
  const auto text = take_value_flag(argc, argv, "--cluster");
  const auto file = take_value_flag(argc, argv, "--cluster-file");
  const bench::options o = bench::parse_options(
      argc, argv,
      "all_reduce (float32 sum, in place) on a simulated cluster, in virtual time; --cluster \"hosts=H "
      "ranks_per_host=R bandwidth=1Gbit latency=50us ...\" or --cluster-file FILE says which "
      "(transport/simulated/cluster_model.hpp; compute=modelled unless it says otherwise); -g is ignored");
  if (!text && !file) {
    std::fprintf(stderr, "allreduce_simulated: say which cluster: --cluster \"hosts=2 ranks_per_host=2 bandwidth=1Gbit ...\" "
                         "or --cluster-file FILE (see --help)\n");
    return 2;
  }
  try {
    sim::cluster_model base;
    base.compute = sim::compute_model::modelled;
    if (file) base = sim::load_cluster_model(*file, base);
    const sim::cluster_model model = sim::parse_cluster_model(text.value_or(""), base);
    return run(model, alg, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_simulated: %s\n", e.what());
    return 1;
  }
}
