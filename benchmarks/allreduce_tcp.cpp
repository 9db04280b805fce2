// nccl-tests-style benchmark: gradwire all_reduce (float32 sum, in place) across processes over asio_tcp, ucx or mpi.
//
// One process per rank, started by scripts/gradwire-run or mpirun (benchmarks/allreduce.sh
// runs it beside the peers):
//
//   gradwire-run -n 4 allreduce_tcp --algorithm ring -b 4 -e 64M -f 4 --csv out.csv
//   UCX_TLS=sm gradwire-run -n 4 allreduce_tcp --transport ucx ...   (UCX: shared memory)
//   gradwire-run -n 2 allreduce_tcp --transport asio-any ...   (TCP behind transport::any_transport)
//   mpirun -np 4 allreduce_tcp --transport mpi ...   (the site's MPI: shared memory, TCP, InfiniBand)
//   allreduce_tcp --transport per-peer ...   (per_peer<ucx, asio_tcp>: UCX shared memory inside a
//                                             host, TCP between hosts; for jobs across hosts)
//
// Each timed iteration: every rank refills its buffer from its pristine input (untimed),
// the ranks meet in a barrier, each times its own all_reduce; an iteration's time is the
// slowest rank's (gathered after the size), a size's time the median over iterations,
// and with --repeats R the median of R such medians. Buffers are allocated and pre-faulted
// once. Rank 0 prints the table and writes the CSV.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <gradwire/asio.hpp>
#include <gradwire/transport/any.hpp>
#if GRADWIRE_HAS_UCX
#include <gradwire/cluster/per_peer.hpp>
#include <gradwire/ucx.hpp>
#endif
#if GRADWIRE_HAS_MPI
#include <gradwire/mpi.hpp>
#endif
#include <gradwire/collective/all_gather.hpp>
#include <gradwire/collective/all_reduce.hpp>
#include <gradwire/collective/barrier.hpp>
#include <gradwire/collective/broadcast.hpp>
#include <string>
#include <vector>

#include "algorithm_flag.hpp"
#include "bench_table.hpp"

namespace gw = gradwire;
namespace col = gradwire::collective;
namespace bench = gradwire::bench;

namespace {

using bench::input_value;

// Elements of this rank's result in its slice that differ from the float64 sum by more
// than float32 rounding of an n-term sum allows.
long long count_wrong(std::span<const float> got, std::uint64_t seed, int n, std::size_t begin, std::size_t end) {
  long long wrong = 0;
  for (std::size_t i = begin; i < end; ++i) {
    double reference = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const double x = input_value(seed, r, i);
      reference += x;
      magnitude += std::fabs(x);
    }
    wrong += !(std::fabs(double(got[i]) - reference) <= n * 0x1p-23 * magnitude);
  }
  return wrong;
}

template <class Transport>
int run(Transport transport, const bench::algorithm alg, bench::options o, const std::string& transport_name) {
  {
    col::communicator comm(std::move(transport), {.timeout = std::chrono::seconds(120), .verify = o.verify_calls});
    const int n = comm.size(), me = comm.rank();
    // One seed for all ranks: rank 0's, or the one given.
    std::vector<double> seed_box{double(o.seed ? o.seed : (std::random_device{}() & 0xffffffffu))};
    col::broadcast(comm, std::span<double>(seed_box), 0);
    o.seed = static_cast<std::uint64_t>(seed_box[0]);

    const std::vector<std::size_t> sizes = bench::sizes(o, sizeof(float));
    const std::size_t max_count = sizes.empty() ? 0 : sizes.back() / sizeof(float);
    gw::aligned_buffer<float> pristine(max_count), work(max_count);
    for (std::size_t i = 0; i < max_count; ++i) pristine.data()[i] = input_value(o.seed, me, i);
    std::memset(work.data(), 0, max_count * sizeof(float));
    comm.template scratch<float>(max_count / static_cast<std::size_t>(n) + 1);  // pre-fault staging
    bench::memcpy_bound bound(me == 0 ? sizes.back() : 0);

    std::vector<std::vector<double>> per_repeat(sizes.size()), bound_per_repeat(sizes.size());
    std::vector<long long> wrong(sizes.size(), 0);
    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t bytes = sizes[k], count = bytes / sizeof(float);
        const int iters = bench::iterations_for(bytes, o.iters), warmup = bench::warmup_for(bytes, o.warmup);
        std::vector<double> mine(static_cast<std::size_t>(iters));
        const std::span<float> data = work.span().first(count);
        for (int it = 0; it < warmup + iters; ++it) {
          if (bytes) std::memcpy(work.data(), pristine.data(), bytes);
          col::barrier(comm);
          const double t0 = bench::seconds_now();
          bench::run_all_reduce(alg, comm, data);
          const double t1 = bench::seconds_now();
          if (it >= warmup) mine[static_cast<std::size_t>(it - warmup)] = t1 - t0;
          if (o.check && it == warmup) {
            // Each rank checks a slice of its own result; the sum of wrong counts reaches rank 0.
            const std::size_t slice = (count + n - 1) / n, begin = std::min(count, slice * me);
            std::vector<double> w{double(count_wrong(data, o.seed, n, begin, std::min(count, begin + slice)))};
            col::all_reduce(comm, std::span<double>(w));
            wrong[k] += static_cast<long long>(w[0]);
          }
        }
        // The slowest rank per iteration: gather everyone's times.
        std::vector<double> all(static_cast<std::size_t>(iters) * n);
        col::all_gather(comm, std::span<const double>(mine), std::span<double>(all));
        std::vector<double> slowest(static_cast<std::size_t>(iters));
        for (int i = 0; i < iters; ++i)
          for (int r = 0; r < n; ++r)
            slowest[i] = std::max(slowest[i], all[static_cast<std::size_t>(r) * iters + i]);
        per_repeat[k].push_back(bench::median(slowest));
        if (me == 0) bound_per_repeat[k].push_back(bound.seconds(bytes, iters));
      }
    }
    if (me == 0) {
      std::FILE* csv = nullptr;
      if (!o.csv.empty()) {
        const bool fresh = !std::filesystem::exists(o.csv);
        csv = std::fopen(o.csv.c_str(), "a");  // appended: one file for all rank counts and algorithms
        if (!csv) {
          std::fprintf(stderr, "allreduce_tcp: cannot write %s: %s\n", o.csv.c_str(), std::strerror(errno));
          return 2;
        }
        if (fresh) std::fprintf(csv, "%s\n", bench::csv_header);
      }
      bench::print_table_header("gradwire all_reduce (" + std::string(bench::name_of(alg)) + ") over " + transport_name + ", " +
                                    std::to_string(n) + " processes; float32 sum in place; time = median "
                                    "over iterations of the slowest rank",
                                o, n);
      std::vector<bench::row> rows;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        bench::row r;
        r.bytes = sizes[k];
        r.count = sizes[k] / sizeof(float);
        r.seconds = bench::median(per_repeat[k]);
        r.seconds_min = *std::min_element(per_repeat[k].begin(), per_repeat[k].end());
        r.seconds_max = *std::max_element(per_repeat[k].begin(), per_repeat[k].end());
        r.memcpy_seconds = bench::median(bound_per_repeat[k]);
        r.bus_factor = bench::all_reduce_bus_factor(n);
        r.wrong = o.check ? wrong[k] : -1;
        r.iters = bench::iterations_for(sizes[k], o.iters);
        r.warmup = bench::warmup_for(sizes[k], o.warmup);
        r.repeats = o.repeats;
        bench::print_row(r);
        if (csv) bench::write_csv_row(csv, "allreduce_tcp," + transport_name + "," + bench::name_of(alg) + "," + std::to_string(n), r);
        rows.push_back(r);
      }
      bench::print_table_footer(rows);
      if (csv) std::fclose(csv);
    }
    long long total_wrong = 0;
    for (long long w : wrong) total_wrong += w;
    col::barrier(comm);
    return total_wrong == 0 ? 0 : 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench::algorithm alg = bench::take_algorithm_flag(argc, argv);
  const std::string transport = bench::take_choice_flag(argc, argv, "--transport", {"asio", "ucx", "asio-any", "per-peer", "mpi"}, "asio");
  bench::options o = bench::parse_options(argc, argv,
                                          "all_reduce (float32 sum, in place) across processes over gradwire's TCP "
                                          "transport, UCX with --transport ucx, or TCP behind transport::any_transport "
                                          "with --transport asio-any, UCX inside a host and TCP between hosts with "
                                          "--transport per-peer, the site's MPI with --transport mpi; start with "
                                          "scripts/gradwire-run -n N or mpirun (--transport mpi: mpirun)");
  try {
    if (transport == "per-peer") {
#if GRADWIRE_HAS_UCX
      return run(gw::cluster::join_per_peer(), alg, o, "per_peer(ucx,asio_tcp)");
#else
      std::fprintf(stderr, "allreduce_tcp: this build has no UCX (gradwire::ucx; Debian: libucx-dev)\n");
      return 2;
#endif
    }
    if (transport == "ucx") {
#if GRADWIRE_HAS_UCX
      const char* tls = std::getenv("UCX_TLS");
      return run(gw::cluster::join_ucx(), alg, o, std::string("ucx(") + (tls ? tls : "default") + ")");
#else
      std::fprintf(stderr, "allreduce_tcp: this build has no UCX (gradwire::ucx; Debian: libucx-dev)\n");
      return 2;
#endif
    }
    if (transport == "mpi") {
#if GRADWIRE_HAS_MPI
      return run(gw::transport::mpi(), alg, o, "mpi");
#else
      std::fprintf(stderr, "allreduce_tcp: this build has no MPI (gradwire::mpi; Debian: libopenmpi-dev)\n");
      return 2;
#endif
    }
    if (transport == "asio-any")  // what a CUDA translation unit gets: one virtual call per operation
      return run(gw::transport::any_transport(gw::cluster::join_tcp()), alg, o, "any_transport(asio_tcp)");
    return run(gw::cluster::join_tcp(), alg, o, "asio_tcp");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_tcp: %s\n", e.what());
    return 1;
  }
}
