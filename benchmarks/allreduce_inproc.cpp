// nccl-tests-style benchmark: gradwire::collective::all_reduce (float32 sum, in place) over transport::inproc,
// N ranks as threads of one process, with a memcpy bound measured in the same run.
//
//   allreduce_inproc -b 4 -e 256M -f 4 -g 2,4 --csv results/allreduce_inproc.csv
//   allreduce_inproc --algorithm halving_doubling -e 4M   (ring | halving_doubling | auto; default auto)
//   allreduce_inproc --wait 0,50 -e 64K   (how waiting ranks wait: auto, the library's choice for
//                                          the rank count and CPUs; block; or SPIN_US,YIELD_US)
//
// Each timed iteration: every rank refills its buffer from its own pristine input (outside
// the timing), the ranks meet in a gradwire barrier, then each times its own all_reduce.
// An iteration's time is the slowest rank's; a size's time is the median over iterations;
// with --repeats R the whole sweep runs R times and the table shows the median of the R
// medians. All buffers are allocated and pre-faulted once, before anything is timed.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <chrono>
#include <optional>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/tensor/aligned_buffer.hpp>
#include <gradwire/transport/inproc.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <cstdlib>
#include <thread>
#include <vector>

#include "algorithm_flag.hpp"
#include "bench_table.hpp"

namespace gw = gradwire;
namespace bench = gradwire::bench;

namespace {

// One rank's memory, reused by every size, repeat and rank count.
struct rank_buffers {
  gw::aligned_buffer<float> input;  // pristine inputs, written once
  gw::aligned_buffer<float> work;   // reduced in place; refilled from input before every iteration
};

void fill_inputs(std::span<float> x, std::uint64_t seed, int rank) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bench::input_value(seed, rank, i);
}

// Counts elements in [begin, end) that are wrong on any of the n ranks: rank 0's value
// differs from the float64 serial sum by more than float32 rounding of an n-term sum can
// explain (n * 2^-23 * sum|x|, a safe multiple of the (n-1) * 2^-24 bound), or another
// rank's value is not bit-identical to rank 0's (the ring promises identical results).
long long count_wrong(const std::vector<rank_buffers>& buffers, int n, std::size_t begin, std::size_t end) {
  long long wrong = 0;
  for (std::size_t i = begin; i < end; ++i) {
    double reference = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const double x = buffers[static_cast<std::size_t>(r)].input.data()[i];
      reference += x;
      magnitude += std::fabs(x);
    }
    const float got = buffers[0].work.data()[i];
    bool bad = !(std::fabs(static_cast<double>(got) - reference) <= n * 0x1p-23 * magnitude);
    for (int r = 1; r < n && !bad; ++r)
      bad = std::bit_cast<std::uint32_t>(buffers[static_cast<std::size_t>(r)].work.data()[i]) !=
            std::bit_cast<std::uint32_t>(got);
    wrong += bad;
  }
  return wrong;
}

// Takes "--wait auto|block|SPIN_US,YIELD_US" out of argv: the inproc_wait_policy to run
// under, nullopt for the library's choice; exits with status 2 on anything else.
std::optional<gw::transport::inproc_wait_policy> take_wait_flag(int& argc, char** argv) {
  std::optional<gw::transport::inproc_wait_policy> policy;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--wait") continue;
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    long spin = 0, yield = 0;
    char tail = 0;
    if (value == "auto") {
      policy.reset();
    } else if (value == "block") {
      policy = gw::transport::inproc_wait_policy{};
    } else if (std::sscanf(value.c_str(), "%ld,%ld%c", &spin, &yield, &tail) == 2 && spin >= 0 && yield >= 0) {
      policy = gw::transport::inproc_wait_policy{std::chrono::microseconds(spin), std::chrono::microseconds(yield)};
    } else {
      std::fprintf(stderr, "%s: --wait takes auto, block or SPIN_US,YIELD_US (e.g. 2,48), got '%s'\n", argv[0],
                   value.c_str());
      std::exit(2);
    }
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    --i;
  }
  return policy;
}

std::string describe(const gw::transport::inproc_wait_policy& p) {
  using std::chrono::duration_cast, std::chrono::microseconds;
  if (p == gw::transport::inproc_wait_policy{}) return "waits sleep at once";
  return "waits spin " + std::to_string(duration_cast<microseconds>(p.spin).count()) + " us, yield to " +
         std::to_string(duration_cast<microseconds>(p.spin + p.yield).count()) + " us, then sleep";
}

// Per size, per repeat: what rank 0 gathers after the size's iterations.
struct size_results {
  std::vector<double> seconds, memcpy_seconds;  // one median per repeat
  long long wrong = 0;
};

// Runs the sweep `o.repeats` times on n ranks and returns one row per size.
std::vector<bench::row> sweep(int n, bench::algorithm alg, gw::transport::inproc_wait_policy wait,
                              const bench::options& o, const std::vector<std::size_t>& sizes,
                              std::vector<rank_buffers>& buffers, bench::memcpy_bound& bound) {
  int max_iters = 0;
  for (std::size_t bytes : sizes) max_iters = std::max(max_iters, bench::iterations_for(bytes, o.iters));
  std::vector<size_results> results(sizes.size());
  // times[i * n + r]: rank r's time of timed iteration i; each rank writes only its own
  // slots, and rank 0 reads them after a barrier (the barrier orders the accesses).
  const auto ranks = static_cast<std::size_t>(n);
  std::vector<double> times(static_cast<std::size_t>(max_iters) * ranks);
  std::vector<long long> wrong_by_rank(ranks);
  const std::size_t max_count = sizes.empty() ? 0 : sizes.back() / sizeof(float);

  gw::transport::run_inproc(gw::transport::inproc_group(n, wait), [&](gw::transport::inproc endpoint) {
    const auto me = static_cast<std::size_t>(endpoint.rank());
    gw::collective::communicator_options options;
    options.verify = o.verify_calls;
    gw::collective::communicator comm(std::move(endpoint), options);
    // Scratch holds at most half the buffer (halving-doubling's first step; the ring's
    // one chunk is less); growing it now keeps its first touch out of the timing.
    comm.template scratch<float>(max_count / 2 + ranks);
    rank_buffers& mine = buffers[me];

    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      const double started = bench::seconds_now();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t bytes = sizes[k], count = bytes / sizeof(float);
        const int iters = bench::iterations_for(bytes, o.iters), warmup = bench::warmup_for(bytes, o.warmup);
        const std::span<float> data = mine.work.span().first(count);
        for (int it = 0; it < warmup + iters; ++it) {
          if (bytes) std::memcpy(mine.work.data(), mine.input.data(), bytes);
          gw::collective::barrier(comm);
          const double t0 = bench::seconds_now();
          bench::run_all_reduce(alg, comm, data);
          const double t1 = bench::seconds_now();
          if (it >= warmup) times[static_cast<std::size_t>(it - warmup) * ranks + me] = t1 - t0;
          if (o.check && it == warmup) {
            // Every rank checks one slice of the elements across all ranks' results;
            // barriers keep the buffers still while others read them.
            gw::collective::barrier(comm);
            const std::size_t slice = (count + ranks - 1) / ranks, begin = std::min(count, slice * me);
            wrong_by_rank[me] = count_wrong(buffers, n, begin, std::min(count, begin + slice));
            gw::collective::barrier(comm);
          }
        }
        gw::collective::barrier(comm);
        if (me == 0) {
          std::vector<double> slowest(static_cast<std::size_t>(iters));
          for (std::size_t i = 0; i < slowest.size(); ++i) {
            const double* row = times.data() + i * ranks;
            slowest[i] = *std::max_element(row, row + ranks);
          }
          size_results& res = results[k];
          res.seconds.push_back(bench::median(std::move(slowest)));
          if (o.check)
            for (long long w : wrong_by_rank) res.wrong += w;
          // The bound runs while the other ranks sleep in the barrier below.
          res.memcpy_seconds.push_back(bound.seconds(bytes, iters));
        }
        gw::collective::barrier(comm);
      }
      if (me == 0)
        std::fprintf(stderr, "# %d ranks: sweep %d/%d took %.1f s\n", n, repeat + 1, o.repeats,
                     bench::seconds_now() - started);
    }
  });

  std::vector<bench::row> rows;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    bench::row r;
    r.bytes = sizes[k];
    r.count = sizes[k] / sizeof(float);
    r.seconds = bench::median(results[k].seconds);
    r.seconds_min = *std::min_element(results[k].seconds.begin(), results[k].seconds.end());
    r.seconds_max = *std::max_element(results[k].seconds.begin(), results[k].seconds.end());
    r.memcpy_seconds = bench::median(results[k].memcpy_seconds);
    r.bus_factor = bench::all_reduce_bus_factor(n);
    r.wrong = o.check ? results[k].wrong : -1;
    r.iters = bench::iterations_for(sizes[k], o.iters);
    r.warmup = bench::warmup_for(sizes[k], o.warmup);
    r.repeats = o.repeats;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::algorithm alg = bench::take_algorithm_flag(argc, argv);
  const std::optional<gw::transport::inproc_wait_policy> wait_flag = take_wait_flag(argc, argv);
  bench::options o = bench::parse_options(
      argc, argv, "all_reduce (float32 sum, in place) over gradwire's in-process transport, N ranks as threads");
  if (o.seed == 0) o.seed = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  const std::vector<std::size_t> sizes = bench::sizes(o, sizeof(float));
  const std::size_t max_bytes = sizes.empty() ? 0 : sizes.back();
  const int max_ranks = *std::max_element(o.ranks.begin(), o.ranks.end());

  // Allocate and pre-fault everything once (first touch runs at ~0.5 GB/s here), one
  // thread per rank so the faults of different ranks overlap.
  const double setup = bench::seconds_now();
  std::vector<rank_buffers> buffers(static_cast<std::size_t>(max_ranks));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < max_ranks; ++r)
      threads.emplace_back([&, r] {
        rank_buffers& b = buffers[static_cast<std::size_t>(r)];
        b.input = gw::aligned_buffer<float>(max_bytes / sizeof(float));
        b.work = gw::aligned_buffer<float>(max_bytes / sizeof(float));
        fill_inputs(b.input.span(), o.seed, r);
      });
  }
  bench::memcpy_bound bound(max_bytes);
  std::fprintf(stderr, "# setup: %d x 2 x %zu B of rank buffers + 2 x %zu B for the memcpy bound in %.1f s\n",
               max_ranks, max_bytes, max_bytes, bench::seconds_now() - setup);

  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "allreduce_inproc: cannot write %s: %s\n", o.csv.c_str(), std::strerror(errno));
      return 2;
    }
    std::fprintf(csv, "%s\n", bench::csv_header);
  }

  long long wrong = 0;
  for (int n : o.ranks) {
    const gw::transport::inproc_wait_policy wait =
        wait_flag.value_or(gw::transport::choose_wait_policy(n, gw::support::usable_cpus()));
    std::vector<bench::row> rows;
    try {
      rows = sweep(n, alg, wait, o, sizes, buffers, bound);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "allreduce_inproc: %d ranks failed: %s\n", n, e.what());
      return 1;
    }
    const std::string title = std::string("gradwire all_reduce (") + bench::name_of(alg) + ") over transport::inproc, " + std::to_string(n) +
                              (n == 1 ? " rank" : " ranks") + " as threads on " +
                              std::to_string(gw::support::usable_cpus()) + " usable CPUs (" + describe(wait) +
                              (wait_flag ? ", --wait" : ", the library's choice") + "); float32 sum in place; time = median over iterations of the slowest "
                              "rank" +
                              (o.verify_calls ? "" : "; --verify-calls 0");
    bench::print_table_header(title, o, n);
    for (const bench::row& r : rows) {
      bench::print_row(r);
      if (csv) bench::write_csv_row(csv, std::string("allreduce_inproc,inproc,") + bench::name_of(alg) + "," + std::to_string(n), r);
      if (r.wrong > 0) wrong += r.wrong;
    }
    bench::print_table_footer(rows);
  }
  if (csv && std::fclose(csv) != 0) {
    std::fprintf(stderr, "allreduce_inproc: error writing %s\n", o.csv.c_str());
    return 2;
  }
  // Never fail on time; fail on wrong results.
  return wrong == 0 ? 0 : 1;
}
