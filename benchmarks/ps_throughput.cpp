// Parameter-server step throughput: gradwire::parameter_server<ps::sync> over transport::asio_tcp or ucx.
//
// One process per rank, started by scripts/gradwire-run with --ps S (the last S ranks
// serve; benchmarks/ps_throughput.sh runs it for several worker/server counts beside a
// loopback TCP bound):
//
//   gradwire-run -n 4 --ps 1 -- ps_throughput --sizes 64K,1M,16M,64M --iters 20 --csv out.csv
//
// Per model size (one float32 tensor of `size` bytes) every rank constructs a
// strategy<host_tensor<float>, optim::sgd, aggregation::parameter_server<ps::sync>,
// transport::asio_tcp>, in the same order. Servers call serve(); workers run a few
// untimed warm-up steps, then time each strategy.step(grads) (push the gradient, pull the
// parameters of the closed step) on their own clock. A sync step closes only when every
// worker has pushed, so the workers run in lock step and rank 0's time stands for all of
// them; the table shows rank 0's median (and its fastest and slowest step).
//
//   bytes/step   = 2 * size: what one worker pushes and pulls per step (headers aside)
//   per-worker   = 2 * size / time
//   aggregate    = workers * 2 * size / time: the servers' total traffic, both directions
//
// --standby on: every server has a standby (ps::options::standby; the launcher's --ps counts
// both: the servers are the first half), which applies every update too, and the pulls of a
// step wait for its acknowledgement: what failover without a restart costs.
//
// MB is 10^6 bytes. After the timed steps each worker checks its parameters against the
// closed form of SGD on constant gradients (worker w pushes w+1 everywhere, so every
// step subtracts lr * (W+1)/2); #wrong counts rank 0's elements off by more than float
// rounding, and servers check that they applied exactly W gradients per step. Exits 1
// if anything was wrong; never on time.
//
// One TCP transport serves every size: gradwire has no way to join a job twice in one
// process (rank 0's rendezvous store lives in its transport), and a strategy owns its
// transport. So after a size, a worker tells the servers it has finished
// (aggregation().finish(), what the destructor would do), and every rank takes the
// transport back out of the strategy, leaving a one-rank placeholder behind for the
// strategy's destructor (which then has nothing to say to anybody).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <gradwire/asio.hpp>
#if GRADWIRE_HAS_UCX
#include <gradwire/ucx.hpp>
#endif
#include <gradwire/gradwire.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_table.hpp"

namespace gw = gradwire;
namespace bench = gradwire::bench;

namespace {

template <class Transport>
using strategy_type = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::parameter_server<gw::ps::sync>,
                                   Transport>;

// A one-rank transport: what a strategy keeps once the real one has been taken back.
template <class Transport>
Transport placeholder() {
  if constexpr (std::is_same_v<Transport, gw::transport::asio_tcp>)
    return gw::transport::asio_tcp(gw::transport::asio_tcp_options{});
#if GRADWIRE_HAS_UCX
  else
    return gw::transport::ucx(gw::transport::ucx_options{});
#endif
}

constexpr double learning_rate = 1.0 / 1024;  // small: parameters stay near 0, where float rounding is finest

struct flags {
  std::vector<std::size_t> sizes{std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20,
                                 std::size_t{64} << 20};
  int iters = 20;  // scaled by size as in the other benchmarks: x5 below 1 MiB, /2 from 4 MiB, /4 from 64 MiB
  int warmup = 3;  // at most 2 from 64 MiB
  std::string csv;
  std::string transport = "asio";  // or ucx (UCX_TLS picks shared memory, TCP, ...)
  int timeout_s = 120;
  bool standby = false;  // each server replicated to a standby rank
};

[[noreturn]] void usage(const char* program, const std::string& error = {}) {
  std::FILE* out = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(out, "%s: %s\n\n", program, error.c_str());
  std::fprintf(out,
               "%s: parameter_server<ps::sync> step (push + pull) throughput over gradwire's TCP transport;\n"
               "start with scripts/gradwire-run -n WORKERS --ps SERVERS -- %s [flags]\n"
               "  --sizes LIST     model sizes in bytes, comma separated; K, M, G suffixes (default 64K,1M,16M,64M)\n"
               "  --iters N        timed steps (default 20; x5 below 1 MiB, /2 from 4 MiB, /4 from 64 MiB, at least 5)\n"
               "  --warmup N       untimed steps first (default 3; at most 2 from 64 MiB)\n"
               "  --timeout S      seconds a server waits for a worker and a worker for a server (default 120)\n"
               "  --csv FILE       append one CSV row per size to FILE (rank 0)\n"
               "  --transport T    asio (default) or ucx (UCX_TLS picks shared memory, TCP, ...)\n"
               "  --standby on|off each server has a standby (default off; --ps counts both: 2 x servers)\n"
               "  -h, --help\n",
               program, program);
  std::exit(error.empty() ? 0 : 2);
}

flags parse(int argc, char** argv) {
  flags f;
  const char* program = argc > 0 ? argv[0] : "ps_throughput";
  auto fail = [&](const std::string& error) { usage(program, error); };
  bench::detail::for_each_flag(argc, argv, [&](std::string_view flag, std::string_view value) {
    bool ok = true;
    if (flag == "--standby") {
      f.standby = value == "on";
      ok = value == "on" || value == "off";
    } else if (flag == "--sizes") {
      ok = bench::detail::parse_size_list(value, f.sizes);
    } else if (flag == "--iters" || flag == "-n") {
      ok = bench::detail::parse_int(value, f.iters) && f.iters >= 1;
    } else if (flag == "--warmup" || flag == "-w") {
      ok = bench::detail::parse_int(value, f.warmup) && f.warmup >= 0;
    } else if (flag == "--timeout") {
      ok = bench::detail::parse_int(value, f.timeout_s) && f.timeout_s >= 1;
    } else if (flag == "--transport") {
      f.transport = std::string(value);
      ok = f.transport == "asio" || f.transport == "ucx";
    } else if (flag == "--csv") {
      f.csv = std::string(value);
      ok = !f.csv.empty();
    } else {
      usage(program, "unknown flag " + std::string(flag));
    }
    return ok;
  }, fail);
  return f;
}

struct result {
  std::size_t bytes = 0;
  double median = 0, fastest = 0, slowest = 0;  // rank 0's step times, seconds
  long long wrong = 0;
  int iters = 0, warmup = 0;
};

constexpr const char* csv_header =
    "benchmark,transport,mode,workers,servers,size_bytes,count,time_us,time_us_min,time_us_max,"
    "bytes_per_worker_step,per_worker_mbps,aggregate_mbps,wrong,iters,warmup";

void print_header(int workers, int servers, const flags& f, const std::string& transport) {
  std::printf("# gradwire parameter_server<ps::sync> over transport::%s: %d worker(s) + %d server(s)%s, one process "
              "each, on loopback; optim::sgd, one float32 tensor per size\n",
              transport.c_str(), workers, servers, f.standby ? " + as many standbys" : "");
  std::printf("# step = strategy.step(): push the gradient + pull the parameters; time = median of rank 0's timed "
              "steps; MB = 10^6 B\n");
  std::printf("# warmup iters: %d iters: %d (x5 below 1 MiB, /2 from 4 MiB, /4 from 64 MiB)\n#\n", f.warmup, f.iters);
  std::printf("# %10s %12s %10s %10s %10s %12s %10s %10s %6s %5s\n", "size", "count", "time", "min", "max",
              "bytes/step", "per-worker", "aggregate", "#wrong", "iters");
  std::printf("# %10s %12s %10s %10s %10s %12s %10s %10s %6s %5s\n", "(B)", "(elements)", "(us)", "(us)", "(us)",
              "(B/worker)", "(MB/s)", "(MB/s)", "", "");
  std::fflush(stdout);
}

void print_row(const result& r, int workers) {
  const double moved = 2.0 * double(r.bytes);
  std::printf("  %10zu %12zu %10.1f %10.1f %10.1f %12.0f %10.1f %10.1f %6lld %5d\n", r.bytes, r.bytes / sizeof(float),
              r.median * 1e6, r.fastest * 1e6, r.slowest * 1e6, moved, moved / r.median / 1e6,
              workers * moved / r.median / 1e6, r.wrong, r.iters);
  std::fflush(stdout);
}

void write_csv_row(std::FILE* csv, const result& r, int workers, int servers, const std::string& transport,
                   bool standby) {
  const double moved = 2.0 * double(r.bytes);
  std::fprintf(csv, "ps_throughput,%s,%s,%d,%d,%zu,%zu,%.1f,%.1f,%.1f,%.0f,%.2f,%.2f,%lld,%d,%d\n", transport.c_str(),
               standby ? "sync+standby" : "sync", workers,
               servers, r.bytes, r.bytes / sizeof(float), r.median * 1e6, r.fastest * 1e6, r.slowest * 1e6, moved,
               moved / r.median / 1e6, workers * moved / r.median / 1e6, r.wrong, r.iters, r.warmup);
}

std::vector<gw::host_tensor<float>> zero_parameters(std::size_t count) {
  std::vector<gw::host_tensor<float>> p;
  p.emplace_back(gw::shape{count});
  std::fill_n(p[0].data(), count, 0.f);  // touched here, not inside a timed step
  return p;
}


template <class Transport>
int run(Transport transport, const flags& f, const std::string& transport_name) {
  {
    const auto spec = gw::cluster::detect();
    const int me = spec.rank;
    const int servers = spec.count(gw::cluster::task_type::ps) / (f.standby ? 2 : 1);
    if (servers < 1)
      throw gw::error(gw::errc::config, "no parameter-server ranks: start with scripts/gradwire-run -n W --ps S "
                                        "(with --standby, --ps 2S)");
    const int workers = spec.world_size - servers * (f.standby ? 2 : 1);

    std::FILE* csv = nullptr;
    if (me == 0) {
      if (!f.csv.empty()) {
        const bool fresh = !std::filesystem::exists(f.csv);
        csv = std::fopen(f.csv.c_str(), "a");  // appended: one file for every worker/server count
        if (!csv) throw gw::error(gw::errc::config, "cannot write " + f.csv + ": " + std::strerror(errno));
        if (fresh) std::fprintf(csv, "%s\n", csv_header);
      }
      print_header(workers, servers, f, transport_name);
    }

    bool all_right = true;
    for (const std::size_t bytes : f.sizes) {
      const std::size_t count = bytes / sizeof(float);
      const int iters = bench::iterations_for(bytes, f.iters), warmup = bench::warmup_for(bytes, f.warmup);
      const int steps = warmup + iters;
      gw::ps::options options;
      options.servers = servers;
      options.standby = f.standby;
      options.timeout = std::chrono::seconds(f.timeout_s);
      strategy_type<Transport> s(std::move(transport), zero_parameters(count), gw::optim::sgd({.lr = learning_rate}),
                      typename strategy_type<Transport>::aggregation_type(options), {.timeout = std::chrono::seconds(f.timeout_s)});
      result r;
      r.bytes = bytes;
      r.iters = iters;
      r.warmup = warmup;
      if (s.is_server()) {
        const gw::ps::server_stats st = s.serve();
        // A server whose shard is empty (a tensor below split_bytes goes whole to one server) closes no step.
        const std::size_t sizes[] = {count};
        const gw::ps::sharding shards(sizes, servers, std::max<std::size_t>(1, options.split_bytes / sizeof(float)));
        const bool empty = shards.elements((me - workers) % servers) == 0;
        const auto want = empty ? std::uint64_t{0} : static_cast<std::uint64_t>(steps);
        if (st.version != want || st.applied != want * static_cast<std::uint64_t>(workers) || st.dropped != 0) {
          std::fprintf(stderr,
                       "ps_throughput: server rank %d, %zu B: closed %llu steps with %llu gradients (%llu dropped); "
                       "expected %llu steps of %d\n",
                       me, bytes, static_cast<unsigned long long>(st.version),
                       static_cast<unsigned long long>(st.applied), static_cast<unsigned long long>(st.dropped),
                       static_cast<unsigned long long>(want), workers);
          all_right = false;
        }
      } else {
        std::vector<gw::host_tensor<float>> grads;
        grads.emplace_back(gw::shape{count});
        std::fill_n(grads[0].data(), count, float(me + 1));
        std::vector<double> times;
        times.reserve(static_cast<std::size_t>(iters));
        for (int k = 0; k < steps; ++k) {
          const double t0 = bench::seconds_now();
          s.step(grads);
          const double t1 = bench::seconds_now();
          if (k >= warmup) times.push_back(t1 - t0);
        }
        s.aggregation().finish(s.communicator());  // the servers stop waiting for this worker
        // SGD on constant gradients: every step subtracts lr * mean = lr * (W+1)/2.
        const double want = -double(steps) * learning_rate * (workers + 1) / 2.0;
        const double tolerance = 1e-5 * std::fabs(want) + 1e-30;
        const float* p = s.parameters()[0].data();
        for (std::size_t i = 0; i < count; ++i) r.wrong += !(std::fabs(double(p[i]) - want) <= tolerance);
        if (r.wrong) {
          std::fprintf(stderr, "ps_throughput: worker rank %d, %zu B: %lld of %zu parameters differ from %.9g\n", me,
                       bytes, r.wrong, count, want);
          all_right = false;
        }
        r.median = bench::median(times);
        r.fastest = *std::min_element(times.begin(), times.end());
        r.slowest = *std::max_element(times.begin(), times.end());
      }
      // Take the transport back for the next size; the strategy keeps a one-rank
      // placeholder, so its destructor neither talks to the job nor uses a moved-from transport.
      transport = std::exchange(s.communicator().transport(), placeholder<Transport>());
      if (me == 0) {
        print_row(r, workers);
        if (csv) write_csv_row(csv, r, workers, servers, transport_name, f.standby), std::fflush(csv);
      }
    }
    if (csv) std::fclose(csv);
    if (me == 0) std::printf("#\n");
    return all_right ? 0 : 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const flags f = parse(argc, argv);
  int me = -1;
  try {
    me = gw::cluster::detect().rank;
    if (f.transport == "ucx") {
#if GRADWIRE_HAS_UCX
      const char* tls = std::getenv("UCX_TLS");
      auto transport = gw::cluster::join_ucx();
      // Which path the workers' pushes and pulls take: one-sided put/get, or tagged messages.
      const bool rma = transport.prefers_one_sided(transport.size() - 1);
      return run(std::move(transport), f, std::string("ucx(") + (tls ? tls : "default") + ")/" + (rma ? "rma" : "tag"));
#else
      throw gw::error(gw::errc::config, "this build has no UCX (gradwire::ucx; Debian: libucx-dev)");
#endif
    }
    return run(gw::cluster::join_tcp(), f, "asio_tcp");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_throughput: rank %d: %s\n", me, e.what());
    return 1;
  }
}
