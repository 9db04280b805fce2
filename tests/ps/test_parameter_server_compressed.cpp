// Parameter servers whose workers push through a codec (aggregation::parameter_server<Mode, Codec>,
// ps/push_codec.hpp), against float64 serial references that apply decode(encode(g)) as each
// codec defines it, written here from the definitions (fp16 and bf16: the cast, round to
// nearest even; int8: a float scale max|x|/127 and rounded multiples of it; top-k: the k
// largest magnitudes, ties to the lower index; error feedback: c = g + r, r' = c - decode;
// PowerSGD: one power iteration on the piece's near-square matrix, warm-started): a codec
// state per worker and shard piece, each server's update the mean (sync) or each (async) of
// the decoded pushes. Over inproc threads, asio_tcp ranks (threads), one-sided windows (an
// inproc transport with put/get: tests/ps/one_sided_inproc.hpp), every mode (the async ones
// with workers in turns, so the order is the test's), and standbys that take a lost server's
// shard over (the simulated transport). Then codecs that do not fit: ranks that disagree on
// the payload, a codec whose decode refuses its own encoded_bytes.
// A TU of its own: the codecs times the modes are many instantiations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <gradwire/compress/codecs.hpp>
#include <gradwire/gradwire.hpp>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#if GRADWIRE_HAS_ASIO
#include "helpers/tcp_threads.hpp"
#endif
#include "helpers/errors.hpp"
#include "one_sided_inproc.hpp"
#include "parameter_server_support.hpp"
#include "standby_support.hpp"

using gradwire::test::is_error;
using namespace gradwire::test::parameter_server_support;
namespace compress = gradwire::compress;

namespace {

using data_type = std::vector<std::vector<batch_data>>;

// --- each codec's decode(encode(x)), in float64, from its definition -------------------

// What a piece's encodes keep from one to the next (error feedback's residual, PowerSGD's Q
// and residual), per worker and piece.
struct ref_state {
  std::vector<double> residual, q;
};

// x rounded to `precision` significant bits, to nearest, ties to even; below 2^min_exponent / 2
// the spacing stays that of the smallest normal (subnormals).
double round_to(double x, int precision, int min_exponent) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);  // x = m 2^e, 1/2 <= |m| < 1
  const double ulp = std::ldexp(1.0, std::max(e, min_exponent) - precision);
  return std::nearbyint(x / ulp) * ulp;
}

std::vector<double> round_trip(const compress::fp16&, ref_state&, std::span<const double> x) {
  std::vector<double> out;
  for (double v : x) out.push_back(round_to(v, 11, -13));  // binary16: 11 bits, normal from 2^-14
  return out;
}
std::vector<double> round_trip(const compress::bf16&, ref_state&, std::span<const double> x) {
  std::vector<double> out;
  for (double v : x) out.push_back(round_to(v, 8, -125));  // bfloat16: 8 bits, float's range
  return out;
}
std::vector<double> round_trip(const compress::int8&, ref_state&, std::span<const double> x) {
  double largest = 0;
  for (double v : x) largest = std::max(largest, std::abs(v));
  const double scale = static_cast<float>(largest / 127);  // stored as a float
  std::vector<double> out;
  for (double v : x) out.push_back(std::clamp(std::nearbyint(v / (scale > 0 ? scale : 1)), -127.0, 127.0) * scale);
  return out;
}
std::vector<double> round_trip(const compress::top_k& c, ref_state&, std::span<const double> x) {
  const std::size_t n = x.size();
  const std::size_t k = std::clamp<std::size_t>(std::size_t(std::ceil(c.fraction() * double(n))), n ? 1 : 0, n);
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return std::abs(x[a]) > std::abs(x[b]); });
  std::vector<double> out(n, 0.0);
  for (std::size_t j = 0; j < k; ++j) out[order[j]] = x[order[j]];
  return out;
}
template <class Codec>
std::vector<double> round_trip(const compress::error_feedback<Codec>& c, ref_state& st, std::span<const double> x) {
  if (st.residual.empty()) st.residual.assign(x.size(), 0.0);
  std::vector<double> corrected(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) corrected[i] = x[i] + st.residual[i];
  ref_state inner;
  const auto out = round_trip(c.codec(), inner, corrected);
  for (std::size_t i = 0; i < x.size(); ++i) st.residual[i] = corrected[i] - out[i];
  return out;
}
// M (the piece plus its residual, row-major in the near-square shape, zero-padded), P = M Q,
// P's columns orthonormal (Gram-Schmidt, projections taken off twice), Q = M^T P kept for the
// next step, decode P Q^T, residual M - P Q^T. Q's first values are the codec's seeded ones.
std::vector<double> round_trip(const compress::powersgd& c, ref_state& st, std::span<const double> x) {
  const std::size_t n = x.size();
  const auto s = c.shape(n);
  const std::size_t rows = s.rows, cols = s.cols, r = s.rank;
  if (st.q.empty()) st.q.assign(cols * r, 0.0), st.residual.assign(n, 0.0);
  compress::low_rank::seed_empty_columns(std::span<double>(st.q), s, c.options().seed);
  std::vector<double> m(rows * cols, 0.0), p(rows * r, 0.0), out(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) m[i] = x[i] + st.residual[i];
  for (std::size_t k = 0; k < r; ++k)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) p[k * rows + i] += m[i * cols + j] * st.q[k * cols + j];
  for (std::size_t k = 0; k < r; ++k) {
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t b = 0; b < k; ++b) {
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += p[k * rows + i] * p[b * rows + i];
        for (std::size_t i = 0; i < rows; ++i) p[k * rows + i] -= dot * p[b * rows + i];
      }
    double norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += p[k * rows + i] * p[k * rows + i];
    norm = std::sqrt(norm);
    for (std::size_t i = 0; i < rows; ++i) p[k * rows + i] = norm > 0 ? p[k * rows + i] / norm : 0.0;
  }
  std::fill(st.q.begin(), st.q.end(), 0.0);
  for (std::size_t k = 0; k < r; ++k)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) st.q[k * cols + j] += m[i * cols + j] * p[k * rows + i];
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < r; ++k) out[i] += p[k * rows + i / cols] * st.q[k * cols + i % cols];
  for (std::size_t i = 0; i < n; ++i) st.residual[i] = m[i] - out[i];
  return out;
}

// The serial reference: the same sharding as the servers' (small_shards), a state per worker
// and piece, and the decoded gradient of a worker, flat.
template <class Codec>
class serial_reference {
 public:
  serial_reference(Codec codec, int workers, int servers)
      : codec_(std::move(codec)),
        shards_(sizes(), servers, std::max<std::size_t>(1, small_shards(servers).split_bytes / sizeof(double))),
        states_(std::size_t(workers)) {}

  std::vector<double> params = flat<double>(start_params<double>(0));

  // Worker w's gradient at `at` (its parameters) on `batch`, through its pieces' codec states.
  std::vector<double> pushed(int w, const batch_data& batch, const std::vector<double>& at) {
    const std::size_t weights = model.outputs * model.inputs;
    const auto g = model.gradients<double>(at.data(), at.data() + weights, batch);
    std::vector<double> out(params.size(), 0.0);
    auto& states = states_[std::size_t(w)];
    std::size_t k = 0;
    for (int s = 0; s < shards_.servers(); ++s)
      for (const auto& p : shards_.shard(s)) {
        if (states.size() <= k) states.emplace_back();
        const auto decoded =
            round_trip(codec_, states[k++], std::span<const double>(g[p.tensor]).subspan(p.begin, p.size()));
        std::copy(decoded.begin(), decoded.end(), out.begin() + std::ptrdiff_t((p.tensor ? weights : 0) + p.begin));
      }
    return out;
  }
  void step(double lr, const std::vector<double>& gradient) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= lr * gradient[i];
  }

 private:
  static std::vector<std::size_t> sizes() { return {model.outputs * model.inputs, model.outputs}; }
  Codec codec_;
  gw::ps::sharding shards_;
  std::vector<std::vector<ref_state>> states_;  // [worker][piece, servers in order]
};

// Sync: each step, the mean of every worker's decoded push at the same parameters.
// [worker][step]: the parameters after it (the same for every worker).
template <class Codec>
std::vector<std::vector<std::vector<double>>> serial_sync(const Codec& codec, int workers, int servers, double lr,
                                                          const data_type& data) {
  serial_reference<Codec> ref(codec, workers, servers);
  std::vector<std::vector<double>> history;
  for (const auto& batches : data) {
    std::vector<double> sum(ref.params.size(), 0.0);
    for (int w = 0; w < workers; ++w) {
      const auto d = ref.pushed(w, batches[std::size_t(w)], ref.params);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += d[i];
    }
    for (auto& v : sum) v /= double(workers);
    ref.step(lr, sum);
    history.push_back(ref.params);
  }
  return std::vector<std::vector<std::vector<double>>>(std::size_t(workers), history);
}

// Workers in turns (0, 1, ..., 0, ...), each push applied before the next worker's step
// (async, bounded staleness), or, `only_first`, only worker 0's (backup_workers<1>: each
// step closes with worker 0's push, and worker 1's, from the version before, is late).
// A worker's gradient is at the parameters its previous step pulled, which the other
// workers' pushes since then have moved on from.
template <class Codec>
std::vector<std::vector<std::vector<double>>> serial_in_turns(const Codec& codec, int workers, int servers, double lr,
                                                              const data_type& data, bool only_first = false) {
  serial_reference<Codec> ref(codec, workers, servers);
  std::vector<std::vector<double>> pulled(static_cast<std::size_t>(workers), ref.params);
  std::vector<std::vector<std::vector<double>>> after(static_cast<std::size_t>(workers));
  for (const auto& batches : data)
    for (int w = 0; w < workers; ++w) {
      const auto d = ref.pushed(w, batches[std::size_t(w)], pulled[std::size_t(w)]);  // encoded even if dropped
      if (!only_first || w == 0) ref.step(lr, d);
      pulled[std::size_t(w)] = ref.params;
      after[std::size_t(w)].push_back(ref.params);
    }
  return after;
}

void require_trajectories(const std::vector<std::vector<std::vector<double>>>& got,
                          const std::vector<std::vector<std::vector<double>>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t w = 0; w < want.size(); ++w) {
    REQUIRE(got[w].size() == want[w].size());
    for (std::size_t k = 0; k < want[w].size(); ++k) {
      CAPTURE(w, k);
      require_close_to_largest(got[w][k], want[w][k]);
    }
  }
}

// --- the parameter-server job, on any transport ----------------------------------------

struct ps_run {
  std::vector<std::vector<std::vector<double>>> after;  // [worker][step]: its parameters after the step
  std::vector<gw::ps::server_stats> stats;              // [server]
  std::vector<std::size_t> put_bytes;                   // [worker]: bytes put one-sided (one_sided_inproc)
};

// One rank's part: plain SGD in double, small_shards(servers), pushes through `codec`;
// `in_turns`: workers step one at a time, in rank order, on the test's counts.
template <class Mode, class Codec>
class ps_job {
 public:
  ps_job(Codec codec, int workers, int servers, double lr, const data_type& data, bool in_turns)
      : codec_(std::move(codec)), workers_(workers), servers_(servers), lr_(lr), data_(data), in_turns_(in_turns),
        counts_(workers) {
    run.after.resize(std::size_t(workers));
    run.stats.resize(std::size_t(servers));
    run.put_bytes.resize(std::size_t(workers));
  }

  template <class Transport>
  void rank(Transport t) {
    using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, Mode, Transport, Codec>;
    const int me = t.rank();
    S s(std::move(t), start_params<double>(me), gw::optim::sgd({.lr = lr_}),
        gw::aggregation::parameter_server<Mode>(small_shards(servers_)).compress(codec_));
    if (s.is_server()) {
      auto st = s.serve();
      std::lock_guard lock(m_);
      run.stats[std::size_t(me - workers_)] = std::move(st);
      return;
    }
    if (in_turns_) counts_.set_up();
    for (std::size_t k = 0; k < data_.size(); ++k) {
      if (in_turns_) {
        const std::uint64_t turn = k * std::size_t(workers_) + std::size_t(me);
        counts_.wait([&](const auto&, const auto& finished) { return sum_of(finished) == turn; },
                     "turn " + std::to_string(turn));
      }
      counts_.start(me);
      const auto p = s.parameters();
      s.step(model.gradients<double>(p[0].data(), p[1].data(), data_[k][std::size_t(me)]));
      run.after[std::size_t(me)].push_back(flat<double>(s.parameters()));
      counts_.finish(me);
    }
    if constexpr (std::is_same_v<Transport, gw::test::one_sided_inproc>)
      run.put_bytes[std::size_t(me)] = s.communicator().transport().put_bytes();
  }

  ps_run run;

 private:
  Codec codec_;
  int workers_, servers_;
  double lr_;
  const data_type& data_;
  bool in_turns_;
  step_counts counts_;
  std::mutex m_;
};

// On inproc threads (Transport built from each endpoint: inproc itself, or one_sided_inproc).
template <class Mode, class Transport = gw::transport::inproc, class Codec>
ps_run run_inproc(const Codec& codec, int workers, int servers, double lr, const data_type& data,
                  bool in_turns = false) {
  ps_job<Mode, Codec> job(codec, workers, servers, lr, data, in_turns);
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) { job.rank(Transport(std::move(t))); });
  return std::move(job.run);
}

#if GRADWIRE_HAS_ASIO
template <class Mode, class Codec>
ps_run run_tcp(const Codec& codec, int workers, int servers, double lr, const data_type& data) {
  ps_job<Mode, Codec> job(codec, workers, servers, lr, data, false);
  gw::testing::run_tcp_threads(workers + servers, "ps-compressed", [&](gw::transport::asio_tcp t) { job.rank(std::move(t)); });
  return std::move(job.run);
}
#endif

// Every kind, and error feedback around the biased ones. top_k at 0.3: a piece of 10 keeps 3.
// PowerSGD rank 1 approximates the larger pieces (a 10-element piece is 3 x 4), rank 2 is exact
// on the 1- and 2-element ones.
template <class Fn>
void for_each_codec(Fn&& fn) {
  fn("fp16", compress::fp16{});
  fn("bf16", compress::bf16{});
  fn("int8", compress::int8{});
  fn("top_k", compress::top_k(0.3));
  fn("error_feedback<int8>", compress::error_feedback<compress::int8>());
  fn("error_feedback<top_k>", compress::error_feedback<compress::top_k>(compress::top_k(0.3)));
  fn("powersgd rank 1", compress::powersgd({.rank = 1}));
  fn("powersgd rank 2", compress::powersgd({.rank = 2}));
}

std::size_t pushed_total(const std::vector<std::uint64_t>& pushes) {
  return std::size_t(std::accumulate(pushes.begin(), pushes.end(), std::uint64_t{0}));
}

}  // namespace

TEST_CASE("parameter_server<sync> through each codec equals the float64 serial reference of the mean of decode(encode(g_w)), a codec state per worker and piece") {
  const int workers = GENERATE(1, 3);
  const int servers = GENERATE(1, 2);
  constexpr int steps = 5;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(workers, servers, seed);
  const auto data = make_batches(steps, workers, seed);
  for_each_codec([&](const char* name, const auto& codec) {
    CAPTURE(name);
    const auto run = run_inproc<gw::ps::sync>(codec, workers, servers, lr, data);
    require_trajectories(run.after, serial_sync(codec, workers, servers, lr, data));
    for (const auto& st : run.stats) {
      CHECK(st.version == std::uint64_t(steps));
      CHECK(st.applied == std::uint64_t(workers * steps));
      CHECK(st.one_sided == 0);
    }
  });
}

TEST_CASE("parameter_server<sync> through a codec over one-sided windows: each push is its payload put into a zone sized for it, and training equals the float64 reference") {
  constexpr int workers = 3, servers = 2, steps = 4;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const std::vector<std::size_t> sizes{model.outputs * model.inputs, model.outputs};
  const gw::ps::sharding shards(sizes, servers, small_shards(servers).split_bytes / sizeof(double));
  for_each_codec([&](const char* name, const auto& codec) {
    CAPTURE(name);
    const auto run = run_inproc<gw::ps::sync, gw::test::one_sided_inproc>(codec, workers, servers, lr, data);
    require_trajectories(run.after, serial_sync(codec, workers, servers, lr, data));
    std::size_t payload = 0;  // a step's pushes, to every server
    for (int s = 0; s < servers; ++s)
      for (const auto& p : shards.shard(s)) payload += codec.template encoded_bytes<double>(p.size());
    for (int w = 0; w < workers; ++w) CHECK(run.put_bytes[std::size_t(w)] == payload * steps);  // the payloads alone
    for (const auto& st : run.stats) CHECK(st.one_sided == std::uint64_t(workers * steps));
  });
}

TEST_CASE("parameter_server<async>, <bounded_staleness<1>> and <backup_workers<1>> through a codec, workers in turns, equal the float64 reference of each push applied as it comes, worker 1's late ones dropped in backup_workers") {
  constexpr int workers = 2, servers = 2, steps = 4;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const compress::error_feedback<compress::top_k> ef_top_k(compress::top_k(0.3));
  const compress::powersgd powersgd({.rank = 1});
  SECTION("async") {
    require_trajectories(run_inproc<gw::ps::async>(ef_top_k, workers, servers, lr, data, true).after,
                         serial_in_turns(ef_top_k, workers, servers, lr, data));
    require_trajectories(run_inproc<gw::ps::async>(powersgd, workers, servers, lr, data, true).after,
                         serial_in_turns(powersgd, workers, servers, lr, data));
  }
  SECTION("bounded_staleness<1>, and over one-sided windows") {
    require_trajectories(run_inproc<gw::ps::bounded_staleness<1>>(ef_top_k, workers, servers, lr, data, true).after,
                         serial_in_turns(ef_top_k, workers, servers, lr, data));
    const auto run = run_inproc<gw::ps::bounded_staleness<1>, gw::test::one_sided_inproc>(compress::int8{}, workers,
                                                                                        servers, lr, data, true);
    require_trajectories(run.after, serial_in_turns(compress::int8{}, workers, servers, lr, data));
    for (const auto& st : run.stats) CHECK(st.one_sided == std::uint64_t(workers * steps));
  }
  SECTION("backup_workers<1>, and over one-sided windows") {
    for (const bool one_sided : {false, true}) {
      CAPTURE(one_sided);
      const auto run = one_sided ? run_inproc<gw::ps::backup_workers<1>, gw::test::one_sided_inproc>(
                                       ef_top_k, workers, servers, lr, data, true)
                                 : run_inproc<gw::ps::backup_workers<1>>(ef_top_k, workers, servers, lr, data, true);
      require_trajectories(run.after, serial_in_turns(ef_top_k, workers, servers, lr, data, /*only_first=*/true));
      for (const auto& st : run.stats) {
        CHECK(st.applied == std::uint64_t(steps));
        CHECK(st.dropped == std::uint64_t(steps));
        CHECK(st.dropped_by == std::vector<std::uint64_t>{0, std::uint64_t(steps)});
        CHECK(pushed_total(st.pushes) == std::size_t(workers * steps));
      }
    }
  }
}

TEST_CASE("parameter_server through error_feedback<top_k> carries each piece's residual from step to step on its worker, and leaves a reference that drops it") {
  // The reference above carries the residual exactly; here the same job is checked against a
  // reference that forgets it (plain top_k), which it must not match after the first step.
  constexpr int workers = 2, servers = 2, steps = 4;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const compress::error_feedback<compress::top_k> codec(compress::top_k(0.3));
  const auto run = run_inproc<gw::ps::sync>(codec, workers, servers, lr, data);
  const auto with = serial_sync(codec, workers, servers, lr, data);
  const auto without = serial_sync(compress::top_k(0.3), workers, servers, lr, data);
  require_trajectories(run.after, with);
  require_close_to_largest(run.after[0][0], without[0][0]);  // step 1: no residual yet
  double apart = 0;
  for (std::size_t i = 0; i < without[0].back().size(); ++i)
    apart = std::max(apart, std::abs(run.after[0].back()[i] - without[0].back()[i]));
  CHECK(apart > 1e-6);
}

#if GRADWIRE_HAS_ASIO
TEST_CASE("parameter_server<sync> through a codec over asio_tcp ranks (threads) equals the float64 serial reference") {
  constexpr int workers = 2, servers = 2, steps = 4;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  auto check = [&](const char* name, const auto& codec) {
    CAPTURE(name);
    const auto run = run_tcp<gw::ps::sync>(codec, workers, servers, lr, data);
    require_trajectories(run.after, serial_sync(codec, workers, servers, lr, data));
  };
  check("bf16", compress::bf16{});
  check("error_feedback<int8>", compress::error_feedback<compress::int8>());
  check("error_feedback<top_k>", compress::error_feedback<compress::top_k>(compress::top_k(0.3)));
  check("powersgd rank 1", compress::powersgd({.rank = 1}));
}
#endif

TEST_CASE("parameter_server<sync> through error_feedback<int8> with standbys: a server killed right after it answers a step's pull fails over, the step's payload is resent as it was (not encoded again), and every worker ends with the float64 reference") {
  constexpr int workers = 2, servers = 2, steps = 5;
  constexpr std::uint64_t killed_at = 2;
  constexpr double lr = 0.1;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const compress::error_feedback<compress::int8> codec;
  const auto want = serial_sync(codec, workers, servers, lr, data)[0];
  SECTION("no failure: the standbys mirror the decoded updates") {
    replication_record record(servers);
    const auto run = run_with_standbys(lr, data, record, {.ack_delay = std::chrono::milliseconds(1)}, codec);
    for (const auto& outcome : run.outcomes)
      if (outcome) std::rethrow_exception(outcome);
    for (int k = 0; k < servers; ++k) CHECK(run.stats[std::size_t(servers + k)].replicated == std::uint64_t(workers * steps));
    require_serial_trajectories(run, want);
  }
  SECTION("server rank 2 killed after its first reply of version 2") {
    replication_record record(servers);
    const auto run = run_with_standbys(lr, data, record,
                                       {.ack_delay = std::chrono::milliseconds(1),
                                        .kill_rank = workers,
                                        .kill_at = killed_at,
                                        .kill_after = std::chrono::microseconds(20)},
                                       codec);
    REQUIRE(run.outcomes[workers]);
    REQUIRE_THROWS_AS(std::rethrow_exception(run.outcomes[workers]), killed_by_test);
    for (std::size_t r = 0; r < run.outcomes.size(); ++r)
      if (r != std::size_t(workers) && run.outcomes[r]) std::rethrow_exception(run.outcomes[r]);
    const auto& standby = run.stats[std::size_t(servers)];
    CHECK(standby.promoted);
    CHECK(standby.version == std::uint64_t(steps));
    CHECK(standby.applied == std::uint64_t(workers * steps));
    require_serial_trajectories(run, want);
  }
}

namespace {

// fp16 that says a payload is 2 bytes longer than its encode writes and its decode takes: a
// codec whose encoded_bytes does not match its decode.
struct lying_fp16 {
  static constexpr gw::concepts::compression_kind kind = gw::concepts::compression_kind::linear;
  static constexpr const char* name = "lying_fp16";
  template <class V>
  using state = compress::fp16::state<V>;
  template <class V>
  state<V> init(std::size_t n) const {
    return fp16.init<V>(n);
  }
  template <class V>
  std::size_t encoded_bytes(std::size_t n) const {
    return 2 * n + 2;
  }
  template <class V>
  void encode(state<V>& s, std::span<const V> in, std::span<std::byte> out) const {
    fp16.encode(s, in, out.first(2 * in.size()));
  }
  template <class V>
  void encode(std::span<const V> in, std::span<std::byte> out) const {
    fp16.encode(in, out.first(2 * in.size()));
  }
  template <class V>
  void decode(std::span<const std::byte> in, std::span<V> out) const {
    fp16.decode(in, out);
  }
  template <class V>
  void decode_add(std::span<const std::byte> in, std::span<V> inout) const {
    fp16.decode_add(in, inout);
  }
  compress::fp16 fp16;
};
static_assert(gw::concepts::compressor<lying_fp16, double>);

}  // namespace

TEST_CASE("parameter_server refuses a codec that does not fit: ranks that lay pushes out differently at setup (mismatch on every rank), and a payload the codec's decode refuses (invalid_argument naming the worker and the codec), by messages and by windows") {
  constexpr int workers = 2, servers = 1;
  const auto data = make_batches(2, workers, 7);
  SECTION("worker rank 1 keeps 50% where the others keep 30%: every rank refuses at setup") {
    using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::sync, gw::transport::inproc,
                                   compress::top_k>;
    std::vector<gw::testing::outcome> outcomes(workers + servers);
    gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
      const int me = t.rank();
      outcomes[std::size_t(me)] = gw::testing::outcome_of([&] {
        S s(std::move(t), start_params<double>(me), gw::optim::sgd({.lr = 0.1}),
            gw::aggregation::parameter_server<gw::ps::sync>(small_shards(servers)).compress(compress::top_k(me == 1 ? 0.5 : 0.3)));
      });
    });
    for (int r = 0; r < workers + servers; ++r) {
      CAPTURE(r, outcomes[std::size_t(r)].what);
      CHECK(outcomes[std::size_t(r)].kind == gw::errc::mismatch);
      CHECK_THAT(outcomes[std::size_t(r)].what,
                 Catch::Contains("parameter_server: rank 1 pushes through another codec or other codec settings than "
                                 "the chief (rank 0)") &&
                     Catch::Contains("(rank " + std::to_string(r) + ": codec 'top_k', payloads of " +
                                     (r == 1 ? "156" : "96") + " bytes to the servers)"));
    }
  }
  SECTION("a decode that refuses encoded_bytes' payload, by messages") {
    REQUIRE_THROWS_MATCHES(run_inproc<gw::ps::sync>(lying_fp16{}, workers, servers, 0.1, data), gw::error,
                           is_error(gw::errc::invalid_argument,
                                    {"parameter server rank 2: worker rank", "push does not decode through codec 'lying_fp16'",
                                     "gradwire::compress::fp16: a payload of"}));
  }
  SECTION("a decode that refuses encoded_bytes' payload, by windows") {
    REQUIRE_THROWS_MATCHES(
        (run_inproc<gw::ps::async, gw::test::one_sided_inproc>(lying_fp16{}, workers, servers, 0.1, data)), gw::error,
        is_error(gw::errc::invalid_argument, {"push does not decode through codec 'lying_fp16'"}));
  }
}

TEST_CASE("aggregation::parameter_server::compress gives the policy its codec and keeps its options, and without one it has none") {
  gw::ps::options o = small_shards(3);
  o.staleness_aware_lr = true;
  const gw::aggregation::parameter_server<gw::ps::async> plain(o);
  static_assert(!decltype(plain)::has_codec);
  const auto with = plain.compress(compress::top_k(0.25));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(with)>,
                               gw::aggregation::parameter_server<gw::ps::async, compress::top_k>>);
  static_assert(decltype(with)::has_codec);
  CHECK(with.codec().fraction() == 0.25);
  CHECK(with.servers() == 3);
  CHECK(with.options().staleness_aware_lr);
  static_assert(std::is_same_v<decltype(with)::agent<float, gw::transport::inproc>::codec_type, compress::top_k>);
  // The agent with a codec is the same kind of agent to strategy<> as without one.
  using agent = gw::aggregation::parameter_server<gw::ps::sync, compress::powersgd>::agent<double, gw::transport::inproc>;
  static_assert(gw::concepts::aggregation_agent<agent, double, gw::transport::inproc> &&
                gw::concepts::serving_agent<agent, double, gw::transport::inproc, gw::optim::sgd> &&
                gw::concepts::finishing_agent<agent, gw::transport::inproc> &&
                gw::concepts::staleness_reporting_agent<agent>);
}
