// Shared by gradwire's benchmarks: nccl-tests flags, size sweep, timing, memcpy bound, table and CSV output.
//
// Every benchmark binary takes the same flags and prints the same table, so results of
// different collectives and transports (and of the peers in ../shared/peers) line up.
// Times are medians; benchmarks never pass or fail on time, only on #wrong.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gradwire/tensor/aligned_buffer.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::bench {

// --- flags -------------------------------------------------------------------------

struct options {
  std::size_t min_bytes = 4;                       // -b
  std::size_t max_bytes = std::size_t{256} << 20;  // -e
  std::size_t factor = 4;                          // -f (multiplicative step)
  int iters = 20;                                  // -n, scaled by size (iterations_for)
  int warmup = 5;                                  // -w, capped for large sizes (warmup_for)
  int check = 1;                                   // -c: 1 = verify results in one timed iteration per size
  std::vector<int> ranks{2, 4};                    // -g / --ranks
  std::string csv;                                 // --csv FILE (empty: no CSV)
  int repeats = 3;                                 // --repeats: whole sweeps; report the median of their medians
  bool verify_calls = true;                        // --verify-calls: gradwire's per-call descriptor check
  std::uint64_t seed = 0;                          // --seed (0: pick one and print it)
};

namespace detail {

[[noreturn]] inline void usage(const char* program, const char* what, const std::string& error = {}) {
  std::FILE* out = error.empty() ? stdout : stderr;
  if (!error.empty()) std::fprintf(out, "%s: %s\n\n", program, error.c_str());
  std::fprintf(
      out,
      "%s: %s\n"
      "usage: %s [flags]\n"
      "  -b, --minbytes SIZE      smallest message (default 4); SIZE may end in K, M or G (binary)\n"
      "  -e, --maxbytes SIZE      largest message (default 256M)\n"
      "  -f, --stepfactor F       multiply the size by F each step (default 4)\n"
      "  -n, --iters N            timed iterations (default 20; 5x below 1 MiB, fewer from 4 MiB on)\n"
      "  -w, --warmup_iters N     untimed iterations first (default 5; at most 3 from 4 MiB, 2 from 64 MiB)\n"
      "  -c, --check 0|1          verify one timed iteration per size against a float64 reference (default 1)\n"
      "  -g, --ranks LIST         rank counts to sweep, comma separated (default 2,4)\n"
      "      --repeats R          run each sweep R times, report the median of the per-run medians (default 3)\n"
      "      --csv FILE           also write one CSV row per rank count and size to FILE\n"
      "      --verify-calls 0|1   gradwire's check that all ranks made the same call (default 1, as in the library)\n"
      "      --seed S             seed of the random inputs (default: random, printed)\n"
      "  -h, --help\n",
      program, what, program);
  std::exit(error.empty() ? 0 : 2);
}

// "4", "64K", "256M", "1G": binary multiples, as nccl-tests reads them.
inline bool parse_size(std::string_view text, std::size_t& out) {
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        multiplier = std::size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        multiplier = std::size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        multiplier = std::size_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return false;
  if (value > SIZE_MAX / multiplier) return false;
  out = value * multiplier;
  return true;
}

// "64K,1M,16M": sizes in bytes, each rounded down to whole floats; false if one does not parse.
inline bool parse_size_list(std::string_view text, std::vector<std::size_t>& out) {
  out.clear();
  bool ok = true;
  for (std::string_view rest = text; ok && !rest.empty();) {
    const auto comma = rest.find(',');
    std::size_t bytes = 0;
    ok = parse_size(rest.substr(0, comma), bytes) && bytes >= sizeof(float);
    out.push_back(bytes / sizeof(float) * sizeof(float));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return ok && !out.empty();
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size() && !text.empty();
}

inline bool parse_list(std::string_view text, std::vector<int>& out) {
  out.clear();
  while (!text.empty()) {
    const auto comma = text.find(',');
    int value = 0;
    if (!parse_int(text.substr(0, comma), value) || value < 1) return false;
    out.push_back(value);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return !out.empty();
}

// Walks the "-x value" and "--flag=value" pairs of argv: on_flag(flag, value) returns
// whether the value was good (and reports an unknown flag itself); usage(message) exits,
// with an empty message for -h / --help.
template <class OnFlag, class Usage>
void for_each_flag(int argc, char** argv, OnFlag&& on_flag, Usage&& usage) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i], value;
    if (flag == "-h" || flag == "--help") usage(std::string());
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage("flag " + std::string(flag) + " needs a value");
    }
    if (!on_flag(flag, value)) usage("bad value '" + std::string(value) + "' for " + std::string(flag));
  }
}

}  // namespace detail

// Parses the shared flags; prints usage and exits with status 2 on anything it cannot read.
inline options parse_options(int argc, char** argv, const char* what) {
  options o;
  const char* program = argc > 0 ? argv[0] : "benchmark";
  auto usage = [&](const std::string& error) { detail::usage(program, what, error); };
  // Both "-b 64" and "--minbytes=64" work.
  detail::for_each_flag(argc, argv, [&](std::string_view flag, std::string_view value) {
    bool ok = true;
    if (flag == "-b" || flag == "--minbytes")
      ok = detail::parse_size(value, o.min_bytes);
    else if (flag == "-e" || flag == "--maxbytes")
      ok = detail::parse_size(value, o.max_bytes);
    else if (flag == "-f" || flag == "--stepfactor")
      ok = detail::parse_size(value, o.factor) && o.factor >= 2;
    else if (flag == "-n" || flag == "--iters")
      ok = detail::parse_int(value, o.iters) && o.iters >= 1;
    else if (flag == "-w" || flag == "--warmup_iters")
      ok = detail::parse_int(value, o.warmup) && o.warmup >= 0;
    else if (flag == "-c" || flag == "--check")
      ok = detail::parse_int(value, o.check) && o.check >= 0;
    else if (flag == "-g" || flag == "--ranks")
      ok = detail::parse_list(value, o.ranks);
    else if (flag == "--repeats")
      ok = detail::parse_int(value, o.repeats) && o.repeats >= 1;
    else if (flag == "--csv")
      o.csv = std::string(value), ok = !o.csv.empty();
    else if (flag == "--seed")
      ok = detail::parse_int(value, o.seed);
    else if (flag == "--verify-calls") {
      int v = 0;
      ok = detail::parse_int(value, v) && (v == 0 || v == 1);
      o.verify_calls = v == 1;
    } else {
      usage("unknown flag " + std::string(flag));
    }
    return ok;
  }, usage);
  if (o.min_bytes > o.max_bytes)
    detail::usage(program, what,
                  "-b " + std::to_string(o.min_bytes) + " is larger than -e " + std::to_string(o.max_bytes));
  return o;
}

// --- inputs -----------------------------------------------------------------------

// Rank `rank`'s element i of a run seeded `seed`: +-[0.5, 1.5), bounded away from zero so
// that a contribution missing or counted twice is always far outside the rounding
// tolerance of a check, and stateless, so any rank can compute any rank's inputs.
inline float input_value(std::uint64_t seed, int rank, std::size_t i) noexcept {
  auto mix = [](std::uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const std::uint64_t h = mix(mix(seed + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(rank + 1)) + i);
  const float magnitude = 0.5f + static_cast<float>(h >> 40) * 0x1p-24f;
  return (h & 1) ? -magnitude : magnitude;
}

// --- sweep and timing --------------------------------------------------------------

// min_bytes, min_bytes*factor, ... up to max_bytes, each rounded down to whole elements.
inline std::vector<std::size_t> sizes(const options& o, std::size_t element_size) {
  std::vector<std::size_t> out;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    out.push_back(bytes / element_size * element_size);
    if (bytes == 0 || bytes > o.max_bytes / o.factor) break;
  }
  return out;
}

// Iterations for one size. Small messages are cheap and their times are noisy (thread
// wake-ups), so they get 5x -n; from 4 MiB on there are fewer, so that a sweep to 256 MiB
// stays within tens of seconds; never fewer than 5 timed (a median of fewer means little).
inline int iterations_for(std::size_t bytes, int base) {
  if (bytes >= (std::size_t{64} << 20)) return std::max(5, base / 4);
  if (bytes >= (std::size_t{4} << 20)) return std::max(5, base / 2);
  if (bytes >= (std::size_t{1} << 20)) return base;
  return 5 * base;
}
inline int warmup_for(std::size_t bytes, int base) {
  if (bytes >= (std::size_t{64} << 20)) return std::min(base, 2);
  if (bytes >= (std::size_t{4} << 20)) return std::min(base, 3);
  return base;
}

inline double seconds_now() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The true median (mean of the middle two for an even count); 0 for no samples.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2) return upper;
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
}

// nccl-tests' bus-bandwidth factors: what each rank must move relative to the message.
inline double all_reduce_bus_factor(int ranks) { return ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0; }
inline double gather_bus_factor(int ranks) { return ranks > 1 ? double(ranks - 1) / ranks : 0.0; }  // RS, AG
inline double broadcast_bus_factor(int) { return 1.0; }

// Keeps the compiler from dropping or merging copies whose results are never read.
inline void clobber_memory() noexcept { asm volatile("" ::: "memory"); }

// The shared-memory bound, measured in the same run as the collective: memcpy of `bytes`
// between two buffers that are allocated and pre-faulted once (first touch is slow here).
// Small copies are repeated inside one sample so that the clock's resolution does not
// dominate; a sample is the time of one copy.
class memcpy_bound {
 public:
  explicit memcpy_bound(std::size_t max_bytes) : source_(max_bytes), target_(max_bytes) {
    if (max_bytes) std::memset(source_.data(), 1, max_bytes);
  }

  // Median time of one memcpy of `bytes`, in seconds, over `samples` samples.
  double seconds(std::size_t bytes, int samples) {
    if (bytes == 0) return 0;
    const std::size_t batch = std::max<std::size_t>(1, (std::size_t{64} << 10) / bytes);
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(samples));
    std::memcpy(target_.data(), source_.data(), bytes);  // warm: same cache state as the collective's buffers
    for (int s = 0; s < samples; ++s) {
      const double t0 = seconds_now();
      for (std::size_t k = 0; k < batch; ++k) {
        std::memcpy(target_.data(), source_.data(), bytes);
        clobber_memory();
      }
      times.push_back((seconds_now() - t0) / static_cast<double>(batch));
    }
    return median(std::move(times));
  }

 private:
  aligned_buffer<std::byte> source_, target_;
};

// --- table and CSV -------------------------------------------------------------------

// One line of results: the median over repeats of each repeat's median.
struct row {
  std::size_t bytes = 0, count = 0;
  const char* type = "float";
  const char* redop = "sum";
  double seconds = 0;                       // collective time (median)
  double seconds_min = 0, seconds_max = 0;  // spread of the per-repeat medians
  double bus_factor = 0;
  long long wrong = 0;        // -1: not checked
  double memcpy_seconds = 0;  // bound, same size, same run
  int iters = 0, warmup = 0, repeats = 0;

  double algbw() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
  double busbw() const { return algbw() * bus_factor; }
  double memcpy_bw() const { return memcpy_seconds > 0 ? double(bytes) / memcpy_seconds / 1e9 : 0; }
  double bound_ratio() const { return memcpy_bw() > 0 ? busbw() / memcpy_bw() : 0; }
};

inline void print_table_header(const std::string& title, const options& o, int ranks) {
  std::printf("# %s\n", title.c_str());
  std::printf(
      "# nRanks %d minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d (x5 below 1 MiB, fewer from "
      "4 MiB) "
      "repeats: %d validation: %d seed: %llu\n",
      ranks, o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.repeats, o.check,
      static_cast<unsigned long long>(o.seed));
  std::printf("#\n");
  // Group labels centred over their columns: time..#wrong (35 wide), time..busbw/bw (28 wide).
  const auto centre = [](std::string label, std::size_t width) {
    const std::size_t left = label.size() < width ? (width - label.size()) / 2 : 0;
    label.insert(0, left, ' ');
    label.resize(std::max(width, label.size()), ' ');
    return label;
  };
  std::printf("# %10s %12s %8s %6s %s %s\n", "", "", "", "", centre("in-place", 35).c_str(),
              centre("memcpy bound, same size", 28).c_str());
  std::printf("# %10s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %5s\n", "size", "count", "type", "redop", "time",
              "algbw", "busbw", "#wrong", "time", "bw", "busbw/", "reps");
  std::printf("# %10s %12s %8s %6s %10s %8s %8s %6s %10s %8s %8s %5s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
              "(GB/s)", "", "(us)", "(GB/s)", "bw", "");
  std::fflush(stdout);
}

inline void print_row(const row& r) {
  char wrong[24];
  if (r.wrong < 0)
    std::snprintf(wrong, sizeof wrong, "N/A");
  else
    std::snprintf(wrong, sizeof wrong, "%lld", r.wrong);
  std::printf("  %10zu %12zu %8s %6s %10.2f %8.3f %8.3f %6s %10.3f %8.2f %8.3f %5d\n", r.bytes, r.count, r.type,
              r.redop, r.seconds * 1e6, r.algbw(), r.busbw(), wrong, r.memcpy_seconds * 1e6, r.memcpy_bw(),
              r.bound_ratio(), r.repeats);
  std::fflush(stdout);
}

// nccl-tests' closing lines: total wrong elements and the mean busbw over the sweep.
inline void print_table_footer(const std::vector<row>& rows) {
  long long wrong = 0;
  bool checked = false;
  double bus = 0;
  for (const row& r : rows) {
    if (r.wrong >= 0) wrong += r.wrong, checked = true;
    bus += r.busbw();
  }
  if (checked)
    std::printf("# Out of bounds values : %lld %s\n", wrong, wrong == 0 ? "OK" : "FAILED");
  else
    std::printf("# Out of bounds values : not checked (-c 0)\n");
  std::printf("# Avg bus bandwidth    : %.4f\n#\n", rows.empty() ? 0.0 : bus / double(rows.size()));
  std::fflush(stdout);
}

inline constexpr const char* csv_header =
    "benchmark,transport,algorithm,ranks,size_bytes,count,type,redop,time_us,algbw_gbps,busbw_gbps,wrong,"
    "memcpy_us,memcpy_gbps,busbw_over_memcpy,time_us_min,time_us_max,iters,warmup,repeats";

// One CSV line per row; `prefix` holds the benchmark, transport, algorithm and rank columns.
inline void write_csv_row(std::FILE* f, const std::string& prefix, const row& r) {
  std::fprintf(f, "%s,%zu,%zu,%s,%s,%.3f,%.4f,%.4f,%lld,%.4f,%.3f,%.4f,%.3f,%.3f,%d,%d,%d\n", prefix.c_str(), r.bytes,
               r.count, r.type, r.redop, r.seconds * 1e6, r.algbw(), r.busbw(), r.wrong, r.memcpy_seconds * 1e6,
               r.memcpy_bw(), r.bound_ratio(), r.seconds_min * 1e6, r.seconds_max * 1e6, r.iters, r.warmup, r.repeats);
}

}  // namespace gradwire::bench
