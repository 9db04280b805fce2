// One rank of a soak job (benchmarks/soak.sh): trains a small model step after step in one long-lived process,
// checking every step's parameters against an exact float64 reference, until told to stop.
//
//   soak_worker allreduce|local-sgd|ps-sync|ps-async [--steps N] [--elements E] [--status DIR] [--stop FILE]
//               [--pace-ms M] [--corrupt-at K]
//
// Started by scripts/gradwire-run (with --ps S for the ps-* modes; the last S ranks serve):
//   allreduce   multi_worker_mirrored: strategy<..., aggregation::all_reduce, Transport>
//   local-sgd   model averaging every 4 steps: aggregation::averaging<4>
//   ps-sync     parameter_server<ps::sync>; ps-async: parameter_server<ps::async>
// Built over asio_tcp (soak_worker) and over UCX (soak_worker_ucx; UCX_TLS picks the wire).
//
// The gradients are synthetic: rank r's gradient at step k, element i, is a hash of
// (r, k, i) mapped to m / 256 with m an integer in [-8, 8], independent of the parameters,
// so every rank can compute every rank's gradient and the parameters' exact value after any
// number of steps. The arithmetic is exact, not merely close: lr = 1/16, worker counts are
// powers of two (1, 2 or 4), the parameters start on multiples of 2^-14, so every gradient,
// mean, lr * mean, partial sum of the ring and parameter is a multiple of 2^-14 below 1024
// in magnitude, which a float holds exactly (24-bit significand). Any order of summing
// (ring, halving-doubling, the server's arrival order) then gives the same bits as the
// float64 reference, and a check is an equality: one wrong bit is a wrong result. (A random
// walk of steps of at most 2^-9 stays far below 1024 for any run this soak makes; the
// check fails loudly with "out of the exact range" if it did not.)
//
// What each rank checks, after every step:
//   allreduce   parameters == P0 - lr * sum_k mean_r g(r, k)
//   local-sgd   between averaging points its own local walk P - lr * sum g(me, k); at every
//               4th step the average of every rank's walk
//   ps-sync     the pulled parameters of the closed step == the allreduce formula over workers
//   ps-async    worker w's gradient is non-zero only on elements i with i % W == w; after its
//               step, its own elements hold all its gradients, and each other worker's
//               elements, per server shard, hold a prefix of that worker's gradients
//               (one that never shrinks: the servers answer with ever newer versions)
//   servers     at the end: their shard (64 elements spread over it) against the closed
//               form for the versions (sync) or the pushes (async) they report, and
//               applied + dropped == pushed, dropped == 0
// A wrong result is counted (and the first few printed) and the reference takes the values
// found, so one bad step does not count again at every later step.
//
// Stop: when FILE exists it holds a step count S; every worker stops after its S-th step
// and exits 0 (the ranks of a lock-step job must agree on S: soak.sh writes one a few
// seconds beyond the steps the status files report). Without --stop, --steps N (default
// unbounded) ends the run. Status: every second each rank rewrites DIR/rank<R>.status
// (pid, role, steps, checks, wrong, errors, state) for soak.sh's sampler. --corrupt-at K: rank
// 0 adds 2^-14 to its first parameter (parameter servers: 2^-8 to its first gradient element)
// before step K, which the checks must count as wrong (soak.sh --self-test).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gradwire/asio.hpp>
#if GRADWIRE_SOAK_UCX
#include <gradwire/ucx.hpp>
#endif
#include <gradwire/gradwire.hpp>
#include <limits>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

namespace gw = gradwire;

namespace {

#if GRADWIRE_SOAK_UCX
using transport_type = gw::transport::ucx;
transport_type join_job() { return gw::cluster::join_ucx(); }
#else
using transport_type = gw::transport::asio_tcp;
transport_type join_job() { return gw::cluster::join_tcp(); }
#endif

using tensor = gw::host_tensor<float>;
constexpr double lr = 1.0 / 16;
constexpr double exact_limit = 1024.0;  // multiples of 2^-14 below this are exact in a float
constexpr int averaging_period = 4;
constexpr auto timeout = std::chrono::seconds(60);  // a step on 2 busy cores can be slow; a hang still ends

struct flags {
  std::string mode;
  std::uint64_t steps = std::numeric_limits<std::uint64_t>::max();
  std::size_t elements = 24000;
  std::string status_dir, stop_file;
  int pace_ms = 0;
  std::uint64_t corrupt_at = std::numeric_limits<std::uint64_t>::max();
};

// --corrupt-at: a deliberate fault, so that a run can show the checks catch one.
void maybe_corrupt(const flags& f, std::uint64_t k, int rank, std::span<tensor> params,
                   std::vector<std::vector<float>>& grads) {
  if (k != f.corrupt_at || rank != 0) return;
  if (f.mode.starts_with("ps-"))
    grads[0][0] += 0x1p-8f;  // a worker's parameters are pulled: corrupt what it pushes
  else
    params[0].data()[0] += 0x1p-14f;
}

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Rank r's gradient at step k, element i: m / 256, m in [-8, 8].
double gradient(int r, std::uint64_t k, std::size_t i) {
  const std::uint64_t h = mix(mix(static_cast<std::uint64_t>(r) * 0x9e3779b97f4a7c15ULL + k) ^ (i * 0xd1b54a32d192ed03ULL));
  return static_cast<double>(static_cast<int>(h % 17) - 8) / 256.0;
}

// The starting parameters: multiples of 2^-14 in [-1, 1], the same on every rank.
double start_value(std::size_t i) {
  return static_cast<double>(static_cast<std::int64_t>(mix(i + 12345) % 32769) - 16384) / 16384.0;
}

// Three tensors of odd sizes adding up to `elements`.
std::vector<std::size_t> tensor_sizes(std::size_t elements) {
  const std::size_t a = elements * 5 / 8 + 1, b = elements / 4 + 3;
  return {a, b, elements > a + b ? elements - a - b : 1};
}

// What soak.sh reads: one line of key=value pairs, replaced whole (rename) so a reader never sees half.
class status_file {
 public:
  status_file(std::string dir, int rank, std::string role) : role_(std::move(role)) {
    if (dir.empty()) return;
    path_ = dir + "/rank" + std::to_string(rank) + ".status";
    rank_ = rank;
  }
  std::uint64_t steps = 0, checks = 0, wrong = 0, errors = 0;
  void write(const char* state, bool force = false) {
    const auto now = std::chrono::steady_clock::now();
    if (path_.empty() || (!force && now - last_ < std::chrono::seconds(1))) return;
    last_ = now;
    const std::string tmp = path_ + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "pid=%d rank=%d role=%s steps=%llu checks=%llu wrong=%llu errors=%llu state=%s\n", int(getpid()),
                   rank_, role_.c_str(), (unsigned long long)steps, (unsigned long long)checks,
                   (unsigned long long)wrong, (unsigned long long)errors, state);
      std::fclose(f);
      std::rename(tmp.c_str(), path_.c_str());
    }
  }

 private:
  std::string path_, role_;
  int rank_ = -1;
  std::chrono::steady_clock::time_point last_{};
};

int my_rank = -1;

// Compares `got` with `want` element by element (exactly); counts and reports a mismatch,
// then takes the values found as the reference (the next steps are checked from there).
bool expect_exact(status_file& st, const char* what, std::uint64_t step, std::span<const float> got, std::span<double> want,
                  std::span<const std::size_t> only = {}) {
  ++st.checks;
  std::size_t bad = 0, first = 0;
  std::vector<std::pair<std::size_t, float>> found;
  auto at = [&](std::size_t i) {
    if (std::abs(want[i]) >= exact_limit)
      throw gw::error(gw::errc::invalid_argument, std::string(what) + ": the reference left the exact range (|p| < 1024) "
                                                                      "at element " + std::to_string(i));
    if (double(got[i]) != want[i]) {
      if (bad++ == 0) first = i;
      found.push_back({i, got[i]});
    }
  };
  if (only.empty())
    for (std::size_t i = 0; i < got.size(); ++i) at(i);
  else
    for (std::size_t i : only) at(i);
  if (bad == 0) return true;
  if (st.wrong++ < 5)
    std::printf("rank %d: WRONG %s at step %llu: %zu element(s) differ, first %zu: %.9g, reference %.9g\n", my_rank, what,
                (unsigned long long)step, bad, first, double(got[first]), want[first]);
  std::fflush(stdout);
  for (auto [i, v] : found) want[i] = v;
  return false;
}

// The stop step from the stop file, once it exists (0: not yet).
class stop_watch {
 public:
  explicit stop_watch(std::string file) : file_(std::move(file)) {}
  std::uint64_t stop_at() {
    if (file_.empty() || at_ != 0) return at_;
    if (::access(file_.c_str(), R_OK) != 0) return 0;
    std::ifstream in(file_);
    std::uint64_t s = 0;
    if (in >> s) at_ = std::max<std::uint64_t>(s, 1);
    return at_;
  }

 private:
  std::string file_;
  std::uint64_t at_ = 0;
};

// The model's tensors (parameters and a gradient buffer), flattened for the checks.
struct model {
  std::vector<std::size_t> sizes;
  std::size_t total = 0;
  std::vector<tensor> make_parameters() const {
    std::vector<tensor> p;
    std::size_t offset = 0;
    for (std::size_t n : sizes) {
      p.emplace_back(gw::shape{n});
      for (std::size_t i = 0; i < n; ++i) p.back()[i] = static_cast<float>(start_value(offset + i));
      offset += n;
    }
    return p;
  }
};

// Copies the strategy's parameters into one flat vector (the checks index elements flat).
void flatten(std::span<const tensor> params, std::vector<float>& flat) {
  flat.clear();
  for (const auto& t : params) flat.insert(flat.end(), t.data(), t.data() + t.size());
}

template <class Aggregation>
using strategy_type = gw::strategy<tensor, gw::optim::sgd, Aggregation, transport_type>;

void fill_gradients(std::vector<std::vector<float>>& grads, const model& m, int rank, std::uint64_t step,
                    int block_of = 0) {
  std::size_t offset = 0;
  for (std::size_t t = 0; t < m.sizes.size(); ++t) {
    grads[t].resize(m.sizes[t]);
    for (std::size_t i = 0; i < m.sizes[t]; ++i) {
      const std::size_t flat = offset + i;
      const bool mine = block_of == 0 || static_cast<int>(flat % static_cast<std::size_t>(block_of)) == rank;
      grads[t][i] = mine ? static_cast<float>(gradient(rank, step, flat)) : 0.0f;
    }
    offset += m.sizes[t];
  }
}

// Every worker's loop: until --steps or the stop step, a step with this rank's gradients
// (block_of as for fill_gradients), then check(k, flat) of step k's parameters, flattened.
template <class Aggregation, class Check>
void train(const flags& f, strategy_type<Aggregation>& s, const model& m, status_file& st, int block_of, Check check) {
  const int me = s.rank();
  std::vector<std::vector<float>> grads(m.sizes.size());
  std::vector<float> flat;
  stop_watch stop(f.stop_file);
  for (std::uint64_t k = 0; k < f.steps; ++k) {
    if (const auto at = stop.stop_at(); at != 0 && k >= at) break;
    if (f.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.pace_ms));
    fill_gradients(grads, m, me, k, block_of);
    maybe_corrupt(f, k, me, s.parameters(), grads);
    s.step(grads);
    st.steps = k + 1;
    flatten(s.parameters(), flat);
    check(k, std::span<const float>(flat));
    st.write("running");
  }
}

// allreduce, local-sgd and ps-sync workers: every rank knows the exact parameters after every step.
template <class Aggregation>
void lock_step(const flags& f, strategy_type<Aggregation>& s, const model& m, int workers, status_file& st,
               bool local_sgd) {
  const int me = s.rank();
  std::vector<double> mean(m.total), own(m.total);  // the reference: replicas agree on `mean`
  for (std::size_t i = 0; i < m.total; ++i) mean[i] = own[i] = start_value(i);
  train(f, s, m, st, 0, [&](std::uint64_t k, std::span<const float> flat) {
    for (std::size_t i = 0; i < m.total; ++i) {
      double sum = 0;
      for (int w = 0; w < workers; ++w) sum += gradient(w, k, i);
      mean[i] -= lr * (sum / workers);
      if (local_sgd) own[i] -= lr * gradient(me, k, i);
    }
    const bool averaged = !local_sgd || (k + 1) % averaging_period == 0;
    expect_exact(st, local_sgd ? (averaged ? "averaged parameters" : "local parameters") : "parameters", k + 1, flat,
                 averaged ? mean : own);
    if (averaged && local_sgd) own = mean;
  });
}

// ps-async workers: exact on their own elements, a growing prefix of each other worker's gradients elsewhere.
template <class Aggregation>
void async_worker(const flags& f, strategy_type<Aggregation>& s, const model& m, int workers, int servers,
                  std::size_t split_elements, status_file& st) {
  const int me = s.rank();
  const gw::ps::sharding shards(m.sizes, servers, split_elements);
  // Per (worker, server): the flat elements of that worker's block in that server's shard,
  // how many of its gradients they are known to hold, and the reference for them.
  struct tracked {
    std::vector<std::size_t> elements;
    std::uint64_t count = 0;
  };
  std::vector<std::size_t> offsets(m.sizes.size(), 0);
  for (std::size_t t = 1; t < m.sizes.size(); ++t) offsets[t] = offsets[t - 1] + m.sizes[t - 1];
  std::vector<std::vector<tracked>> track(static_cast<std::size_t>(workers), std::vector<tracked>(static_cast<std::size_t>(servers)));
  for (int sv = 0; sv < servers; ++sv)
    for (const auto& p : shards.shard(sv))
      for (std::size_t i = p.begin; i < p.end; ++i) {
        const std::size_t flat = offsets[p.tensor] + i;
        track[flat % static_cast<std::size_t>(workers)][static_cast<std::size_t>(sv)].elements.push_back(flat);
      }
  std::vector<double> ref(m.total);
  for (std::size_t i = 0; i < m.total; ++i) ref[i] = start_value(i);
  std::vector<std::size_t> own;
  for (auto& t : track[static_cast<std::size_t>(me)]) own.insert(own.end(), t.elements.begin(), t.elements.end());
  std::sort(own.begin(), own.end());
  train(f, s, m, st, workers, [&](std::uint64_t k, std::span<const float> flat) {
    for (std::size_t i : own) ref[i] -= lr * gradient(me, k, i);
    expect_exact(st, "own elements", k + 1, flat, ref, own);
    for (int w = 0; w < workers; ++w) {
      if (w == me) continue;
      for (auto& t : track[static_cast<std::size_t>(w)]) {
        if (t.elements.empty()) continue;
        auto matches = [&] {
          for (std::size_t i : t.elements)
            if (double(flat[i]) != ref[i]) return false;
          return true;
        };
        // The other worker runs at about this one's pace; far ahead means something is wrong.
        const std::uint64_t limit = t.count + 100000;
        while (!matches() && t.count < limit) {
          for (std::size_t i : t.elements) ref[i] -= lr * gradient(w, t.count, i);
          ++t.count;
        }
        ++st.checks;
        if (!matches()) {
          if (st.wrong++ < 5)
            std::printf("rank %d: WRONG worker %d's elements hold no prefix of its gradients (looked up to %llu)\n", me,
                        w, (unsigned long long)t.count);
          t.elements.clear();  // no longer tracked: it would count again every step
        }
      }
    }
  });
}

// A server's final check: its shard (up to 64 elements spread over it) against the closed form.
void check_server_shard(std::span<const tensor> params, const model& m, const gw::ps::sharding& shards, int server,
                        const gw::ps::server_stats& stats, int workers, bool async, status_file& st) {
  std::vector<std::size_t> offsets(m.sizes.size(), 0);
  for (std::size_t t = 1; t < m.sizes.size(); ++t) offsets[t] = offsets[t - 1] + m.sizes[t - 1];
  std::vector<std::pair<std::size_t, std::size_t>> sample;  // (tensor, index)
  const std::size_t n = shards.elements(server), stride = std::max<std::size_t>(1, n / 64);
  std::size_t seen = 0;
  for (const auto& p : shards.shard(server))
    for (std::size_t i = p.begin; i < p.end; ++i, ++seen)
      if (seen % stride == 0) sample.push_back({p.tensor, i});
  std::vector<float> got;
  std::vector<double> want;
  for (auto [t, i] : sample) {
    const std::size_t flat = offsets[t] + i;
    double v = start_value(flat);
    if (async) {
      const int w = static_cast<int>(flat % static_cast<std::size_t>(workers));
      for (std::uint64_t k = 0; k < stats.pushes[static_cast<std::size_t>(w)]; ++k) v -= lr * gradient(w, k, flat);
    } else {
      for (std::uint64_t k = 0; k < stats.version; ++k) {
        double sum = 0;
        for (int w = 0; w < workers; ++w) sum += gradient(w, k, flat);
        v -= lr * (sum / workers);
      }
    }
    got.push_back(params[t].data()[i]);
    want.push_back(v);
  }
  expect_exact(st, "server shard", stats.version, got, want);
  std::uint64_t pushed = 0;
  for (auto p : stats.pushes) pushed += p;
  ++st.checks;
  if (stats.applied + stats.dropped != pushed || stats.dropped != 0) {
    ++st.wrong;
    std::printf("rank %d: WRONG server accounting: applied %llu + dropped %llu, pushed %llu\n", my_rank,
                (unsigned long long)stats.applied, (unsigned long long)stats.dropped, (unsigned long long)pushed);
  }
}

template <class Mode>
void parameter_server(const flags& f, const gw::cluster::cluster_spec& spec, const model& m, status_file& st) {
  gw::ps::options o;
  o.servers = spec.count(gw::cluster::task_type::ps);
  o.split_bytes = 4096;  // the larger tensors are split over the servers
  o.timeout = timeout;
  const int workers = spec.world_size - o.servers;
  const std::size_t split_elements = o.split_bytes / sizeof(float);
  constexpr bool async = std::is_same_v<Mode, gw::ps::async>;
  using agg = gw::aggregation::parameter_server<Mode>;
  strategy_type<agg> s(join_job(), m.make_parameters(), gw::optim::sgd({.lr = lr}), agg(o), {.timeout = timeout});
  if (s.is_server()) {
    st.write("serving", true);
    const auto stats = s.serve();
    st.steps = stats.version;
    const int server = spec.rank - workers;
    check_server_shard(s.parameters(), m, gw::ps::sharding(m.sizes, o.servers, split_elements), server, stats, workers,
                       async, st);
    return;
  }
  if constexpr (async)
    async_worker(f, s, m, workers, o.servers, split_elements, st);
  else
    lock_step(f, s, m, workers, st, false);
}

flags parse(int argc, char** argv) {
  flags f;
  if (argc < 2) throw gw::error(gw::errc::invalid_argument, "usage: soak_worker allreduce|local-sgd|ps-sync|ps-async "
                                                            "[--steps N] [--elements E] [--status DIR] [--stop FILE] "
                                                            "[--pace-ms M]");
  f.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw gw::error(gw::errc::invalid_argument, a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") f.steps = std::stoull(value());
    else if (a == "--elements") f.elements = std::stoull(value());
    else if (a == "--status") f.status_dir = value();
    else if (a == "--stop") f.stop_file = value();
    else if (a == "--pace-ms") f.pace_ms = std::stoi(value());
    else if (a == "--corrupt-at") f.corrupt_at = std::stoull(value());
    else throw gw::error(gw::errc::invalid_argument, "unknown option " + a);
  }
  if (f.elements < 64) throw gw::error(gw::errc::invalid_argument, "--elements: give at least 64");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<status_file> st;
  try {
    const flags f = parse(argc, argv);
    const auto spec = gw::cluster::detect();
    my_rank = spec.rank;
    const bool server = spec.rank >= spec.world_size - spec.count(gw::cluster::task_type::ps);
    st = std::make_unique<status_file>(f.status_dir, spec.rank, server ? "server" : "worker");
    st->write("starting", true);
    const int workers = spec.world_size - spec.count(gw::cluster::task_type::ps);
    if (workers & (workers - 1))
      throw gw::error(gw::errc::invalid_argument, "soak_worker: the worker count must be a power of two (the checks are "
                                                  "exact only then); got " + std::to_string(workers));
    const model m{tensor_sizes(f.elements), 0};
    model mm = m;
    for (auto n : mm.sizes) mm.total += n;
    if (f.mode == "allreduce") {
      strategy_type<gw::aggregation::all_reduce> s(join_job(), mm.make_parameters(), gw::optim::sgd({.lr = lr}),
                                                   gw::aggregation::all_reduce(), {.timeout = timeout});
      lock_step(f, s, mm, workers, *st, false);
    } else if (f.mode == "local-sgd") {
      using agg = gw::aggregation::averaging<averaging_period>;
      strategy_type<agg> s(join_job(), mm.make_parameters(), gw::optim::sgd({.lr = lr}), agg(), {.timeout = timeout});
      lock_step(f, s, mm, workers, *st, true);
    } else if (f.mode == "ps-sync") {
      parameter_server<gw::ps::sync>(f, spec, mm, *st);
    } else if (f.mode == "ps-async") {
      parameter_server<gw::ps::async>(f, spec, mm, *st);
    } else {
      throw gw::error(gw::errc::invalid_argument, "unknown mode " + f.mode);
    }
    st->write("done", true);
    std::printf("rank %d: %s steps=%llu checks=%llu wrong=%llu\n", my_rank, st->wrong ? "WRONG" : "PASS",
                (unsigned long long)st->steps, (unsigned long long)st->checks, (unsigned long long)st->wrong);
    return st->wrong ? 3 : 0;
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    std::fflush(stdout);
    if (st) {
      ++st->errors;
      st->write("failed", true);
    }
    return 1;
  }
}
