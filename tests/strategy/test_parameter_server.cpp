// Parameter servers on threads (inproc): sharding, sync == all-reduce, async convergence, the
// staleness bound, backup workers' drop accounting, checkpoint resume, and role errors.
// The same behaviours across processes, including a killed worker, are in tests/multiprocess.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <gradwire/gradwire.hpp>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "../support/least_squares.hpp"
#include "../support/reference.hpp"

using gradwire::test::require_trajectories_close;

namespace gw = gradwire;
using gw::testing::batch_data;
using gw::testing::least_squares;

namespace {

const least_squares model{7, 3, 4};

template <class T>
std::vector<gw::host_tensor<T>> start_params(int rank) {
  std::vector<gw::host_tensor<T>> p;
  p.emplace_back(gw::shape{model.outputs * model.inputs});
  p.emplace_back(gw::shape{model.outputs});
  for (std::size_t i = 0; i < p[0].size(); ++i) p[0][i] = rank == 0 ? T(0.1 * std::sin(double(i))) : T(50);
  for (std::size_t i = 0; i < p[1].size(); ++i) p[1][i] = rank == 0 ? T(0.05 * double(i)) : T(-50);
  return p;
}

// [step][worker] batches from one seed.
std::vector<std::vector<batch_data>> make_batches(int steps, int workers, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<batch_data>> d(steps);
  for (auto& s : d)
    for (int w = 0; w < workers; ++w) s.push_back(model.random_batch(gen));
  return d;
}

// Batches whose targets a linear model can fit: y = A x + c + small noise, so the loss
// of converged training is far below the starting loss.
std::vector<std::vector<batch_data>> make_teacher_batches(int steps, int workers, std::uint64_t seed) {
  auto d = make_batches(steps, workers, seed);
  std::mt19937_64 gen(seed ^ 0x5eed);
  std::normal_distribution<double> dist;
  std::vector<double> a(model.outputs * model.inputs), c(model.outputs);
  for (auto& v : a) v = dist(gen);
  for (auto& v : c) v = dist(gen);
  for (auto& step : d)
    for (auto& b : step) model.fit_targets(b, a, c, 0.01, gen);
  return d;
}

template <class T>
std::vector<T> flat(std::span<const gw::host_tensor<T>> p) {
  std::vector<T> out;
  for (const auto& t : p) out.insert(out.end(), t.data(), t.data() + t.size());
  return out;
}

gw::ps::options small_shards(int servers) {
  gw::ps::options o;
  o.servers = servers;
  o.split_bytes = 8;  // split every tensor of more than 2 floats: exercises split pieces
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Trains `steps` synchronous steps; returns the chief's parameters after every step.
template <class T, class Mode, class O>
std::vector<std::vector<T>> train_ps(int workers, int servers, O opt, const std::vector<std::vector<batch_data>>& data,
                                     gw::ps::options options, std::vector<gw::ps::server_stats>* stats = nullptr) {
  using S = gw::parameter_server<gw::host_tensor<T>, O, Mode>;
  options.servers = servers;
  std::vector<std::vector<T>> history(data.size());
  std::mutex m;
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<T>(me), opt, typename S::aggregation_type(options));
    if (s.is_server()) {
      auto st = s.serve();
      std::lock_guard lock(m);
      if (stats) stats->push_back(st);
      return;
    }
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<T>(p[0].data(), p[1].data(), data[k][me]));
      if (me == 0) history[k] = flat<T>(s.parameters());
    }
  });
  return history;
}

template <class T, class O>
std::vector<std::vector<T>> train_mirrored(int workers, O opt, const std::vector<std::vector<batch_data>>& data) {
  std::vector<std::vector<T>> history(data.size());
  gw::transport::run_inproc(workers, [&](gw::transport::inproc t) {
    gw::mirrored<gw::host_tensor<T>, O> s(t, start_params<T>(t.rank()), opt);
    for (std::size_t k = 0; k < data.size(); ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<T>(p[0].data(), p[1].data(), data[k][t.rank()]));
      if (t.rank() == 0) history[k] = flat<T>(s.parameters());
    }
  });
  return history;
}

double loss(std::span<const float> p, const std::vector<batch_data>& eval) {
  double sum = 0;
  for (const auto& d : eval)
    for (std::size_t n = 0; n < model.batch; ++n)
      for (std::size_t o = 0; o < model.outputs; ++o) {
        double r = p[model.outputs * model.inputs + o] - d.y[n * model.outputs + o];
        for (std::size_t i = 0; i < model.inputs; ++i) r += p[o * model.inputs + i] * d.x[n * model.inputs + i];
        sum += 0.5 * r * r;
      }
  return sum / double(eval.size() * model.batch);
}

}  // namespace

TEST_CASE("ps::partition covers every element once and balances the servers") {
  const std::vector<std::size_t> sizes{1000, 10, 0, 4000, 3, 700};
  for (int servers : {1, 2, 3, 5}) {
    CAPTURE(servers);
    const auto pieces = gw::ps::partition(sizes, servers, 512);
    std::vector<std::vector<int>> owner(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) owner[t].assign(sizes[t], 0);
    std::vector<std::size_t> load(servers, 0);
    for (const auto& p : pieces) {
      REQUIRE(p.server >= 0);
      REQUIRE(p.server < servers);
      REQUIRE(p.end <= sizes[p.tensor]);
      for (std::size_t i = p.begin; i < p.end; ++i) ++owner[p.tensor][i];
      load[p.server] += p.size();
      if (sizes[p.tensor] <= 512) REQUIRE(p.size() == sizes[p.tensor]);  // small tensors stay whole
    }
    for (const auto& o : owner)
      for (int c : o) REQUIRE(c == 1);
    const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    // Largest-first greedy: no server holds more than the fair share plus the largest piece.
    std::size_t largest = 0;
    for (const auto& p : pieces) largest = std::max(largest, p.size());
    REQUIRE(*hi <= total / servers + largest);
    if (servers > 1) REQUIRE(*hi - *lo <= largest);
  }
  // The 4000-element tensor is split over every server when each would get more than 512.
  const auto pieces = gw::ps::partition(sizes, 3, 512);
  REQUIRE(std::count_if(pieces.begin(), pieces.end(), [](const auto& p) { return p.tensor == 3; }) == 3);
}

TEST_CASE("parameter_server<sync> trains like all-reduce (SGD and momentum in float, Adam in double)") {
  const int workers = GENERATE(1, 3);
  const int servers = GENERATE(1, 2);
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(workers, servers, seed);
  const auto data = make_batches(5, workers, seed);
  require_trajectories_close(train_ps<float, gw::ps::sync>(workers, servers, gw::optim::sgd({.lr = 0.1}), data, small_shards(servers)),
                train_mirrored<float>(workers, gw::optim::sgd({.lr = 0.1}), data));
  require_trajectories_close(train_ps<float, gw::ps::sync>(workers, servers, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), data,
                                              small_shards(servers)),
                train_mirrored<float>(workers, gw::optim::momentum({.lr = 0.05, .momentum = 0.9}), data));
  require_trajectories_close(train_ps<double, gw::ps::sync>(workers, servers, gw::optim::adam({.lr = 0.01}), data, small_shards(servers)),
                train_mirrored<double>(workers, gw::optim::adam({.lr = 0.01}), data));
}

TEST_CASE("parameter_server<async> converges and records staleness; bounded_staleness<s> keeps it within s") {
  const int workers = 3, servers = 2, steps = 60;
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const auto data = make_teacher_batches(steps, workers, seed);
  const auto eval = make_teacher_batches(1, 16, seed)[0];
  auto run = [&]<class Mode>(Mode, std::vector<gw::ps::server_stats>& stats) {
    using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, Mode>;
    std::vector<float> first, last;
    gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
      const int me = t.rank();
      S s(t, start_params<float>(me), gw::optim::sgd({.lr = 0.05}), typename S::aggregation_type(small_shards(servers)));
      if (s.is_server()) {
        auto st = s.serve();
        static std::mutex m;
        std::lock_guard lock(m);
        stats.push_back(st);
        return;
      }
      if (me == 0) first = flat<float>(s.parameters());
      for (int k = 0; k < steps; ++k) {
        // Worker 2 is slow: the others run ahead of it.
        if (me == 2) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        const auto p = s.parameters();
        s.step(model.gradients<float>(p[0].data(), p[1].data(), data[k][me]));
      }
      if (me == 0) last = flat<float>(s.parameters());
    });
    return std::pair{loss(first, eval), loss(last, eval)};
  };

  std::vector<gw::ps::server_stats> async_stats, bounded_stats;
  const auto [before, after] = run(gw::ps::async{}, async_stats);
  CAPTURE(before, after);
  REQUIRE(after < 0.1 * before);
  for (const auto& st : async_stats) {
    REQUIRE(st.applied == std::uint64_t(workers * steps));  // every gradient applied, none dropped
    REQUIRE(st.dropped == 0);
    REQUIRE(st.updates == st.applied);
    REQUIRE(std::accumulate(st.staleness.begin(), st.staleness.end(), std::uint64_t{0}) == st.applied);
    REQUIRE(st.version == std::uint64_t(steps));
  }
  // Without a bound the fast workers run far ahead of the slow one.
  REQUIRE(async_stats[0].max_lead > 2);

  run(gw::ps::bounded_staleness<2>{}, bounded_stats);
  for (const auto& st : bounded_stats) {
    REQUIRE(st.applied == std::uint64_t(workers * steps));
    REQUIRE(st.max_lead <= 2);
    REQUIRE(st.staleness.size() <= 3);  // recorded staleness never exceeds s = 2
  }
}

TEST_CASE("parameter_server<backup_workers<1>> closes steps without the slow worker and counts every drop") {
  const int workers = 3, servers = 1, steps = 30;
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::backup_workers<1>>;
  const auto data = make_batches(steps, workers, 7);
  std::vector<gw::ps::server_stats> stats;
  std::vector<std::uint64_t> pushes(workers, 0);
  gw::transport::run_inproc(workers + servers, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<float>(me), gw::optim::sgd({.lr = 0.05}), S::aggregation_type(small_shards(servers)));
    if (s.is_server()) {
      stats.push_back(s.serve());
      return;
    }
    // Train until the servers have applied steps * (workers - 1) gradients; worker 2 is slow.
    for (int k = 0; s.aggregation().applied() < std::uint64_t(steps * (workers - 1)); ++k) {
      if (me == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto p = s.parameters();
      s.step(model.gradients<float>(p[0].data(), p[1].data(), data[k % steps][me]));
      ++pushes[me];
    }
  });
  REQUIRE(stats.size() == 1);
  const auto& st = stats[0];
  CAPTURE(st.version, st.applied, st.dropped, pushes);
  for (int w = 0; w < workers; ++w) REQUIRE(st.pushes[w] == pushes[w]);  // the server saw every push
  const auto total = std::accumulate(pushes.begin(), pushes.end(), std::uint64_t{0});
  REQUIRE(st.applied + st.dropped == total);  // each gradient applied or dropped, exactly once
  REQUIRE(st.applied == st.version * (workers - 1));  // every step closed with the first N-1
  REQUIRE(st.updates == st.version);
  REQUIRE(st.dropped_by[2] > 0);                // the slow worker's late gradients were dropped
  REQUIRE(st.dropped_by[2] * 2 > pushes[2]);    // most of them
  REQUIRE(st.version >= std::uint64_t(steps));
}

TEST_CASE("parameter_server servers checkpoint their shards and a restarted job resumes from them") {
  const auto dir = std::filesystem::temp_directory_path() / ("gradwire-ps-ckpt-" + std::to_string(std::random_device{}()));
  const auto data = make_batches(8, 2, 11);
  auto options = small_shards(2);
  options.checkpoint_dir = dir;
  options.checkpoint_every = 3;
  const auto first = std::vector<std::vector<batch_data>>(data.begin(), data.begin() + 4);
  const auto second = std::vector<std::vector<batch_data>>(data.begin() + 4, data.end());
  std::vector<gw::ps::server_stats> stats;
  const auto a = train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), first, options, &stats);
  REQUIRE(std::filesystem::exists(dir / "ps-shard-0-of-2.ckpt"));
  REQUIRE(std::filesystem::exists(dir / "ps-shard-1-of-2.ckpt"));
  stats.clear();
  const auto b = train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), second, options, &stats);
  for (const auto& st : stats) REQUIRE(st.version == 8);  // resumed at 4, then 4 more steps
  // Resumed (parameters and Adam state) == trained straight through.
  const auto straight = train_mirrored<double>(2, gw::optim::adam({.lr = 0.01}), data);
  require_trajectories_close(a, std::vector<std::vector<double>>(straight.begin(), straight.begin() + 4));
  require_trajectories_close(b, std::vector<std::vector<double>>(straight.begin() + 4, straight.end()));
  // A shard file saved for other tensor sizes is refused with the file named.
  std::filesystem::resize_file(dir / "ps-shard-1-of-2.ckpt", 40);
  auto resume_again = [&] { train_ps<double, gw::ps::sync>(2, 2, gw::optim::adam({.lr = 0.01}), second, options); };
  REQUIRE_THROWS_WITH(resume_again(), Catch::Contains("ps-shard-1-of-2.ckpt"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("parameter_server refuses a job without a worker or server, and step() on a server") {
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  REQUIRE_THROWS_WITH(gw::transport::run_inproc(2,
                                                [](gw::transport::inproc t) {
                                                  S s(t, start_params<float>(t.rank()), gw::optim::sgd(), S::aggregation_type(small_shards(2)));
                                                }),
                      Catch::Contains("at least one server and one worker"));
  REQUIRE_THROWS_WITH(gw::transport::run_inproc(2,
                                                [](gw::transport::inproc t) {
                                                  S s(t, start_params<float>(t.rank()), gw::optim::sgd(), S::aggregation_type(small_shards(1)));
                                                  if (s.is_server())
                                                    s.step(std::vector<std::vector<float>>{
                                                        std::vector<float>(model.outputs * model.inputs),
                                                        std::vector<float>(model.outputs)});
                                                }),
                      Catch::Contains("is a server: call serve()"));
}

TEST_CASE("parameter_server skips a server that holds none of the model, and a moved strategy finishes once") {
  // Two small tensors on three servers: one server holds nothing, and workers never wait for it.
  const auto data = make_batches(4, 2, 5);
  gw::ps::options o;
  o.timeout = std::chrono::seconds(60);
  std::vector<gw::ps::server_stats> stats;
  require_trajectories_close(train_ps<float, gw::ps::sync>(2, 3, gw::optim::sgd({.lr = 0.1}), data, o, &stats),
                train_mirrored<float>(2, gw::optim::sgd({.lr = 0.1}), data));
  REQUIRE(stats.size() == 3);
  REQUIRE(std::count_if(stats.begin(), stats.end(), [](const auto& s) { return s.applied == 0; }) == 1);

  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    S s(t, start_params<float>(t.rank()), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(small_shards(1)));
    S moved = std::move(s);  // the moved-from strategy must not tell the server anything
    if (moved.is_server()) {
      REQUIRE(moved.serve().pushes == std::vector<std::uint64_t>{1});
      return;
    }
    const auto p = moved.parameters();
    moved.step(model.gradients<float>(p[0].data(), p[1].data(), data[0][0]));
  });
}

TEST_CASE("parameter_server staleness_aware_lr divides each async step by the gradient's update lag") {
  // Every gradient is all ones, so each parameter moves by -lr * (sum over gradients of
  // 1 / max(1, update lag)), which the server's update-lag histogram determines exactly.
  const int workers = 3, steps = 20;
  const double lr = 0.01;
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::async>;
  auto options = small_shards(1);
  options.staleness_aware_lr = true;
  gw::ps::server_stats stats;
  std::vector<double> served;  // the server's parameters when it stops: the final model
  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
    S s(t, start_params<double>(t.rank()), gw::optim::sgd({.lr = lr}), S::aggregation_type(options));
    if (s.is_server()) {
      stats = s.serve();
      served = flat<double>(s.parameters());
      return;
    }
    const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                                std::vector<double>(model.outputs, 1.0)};
    for (int k = 0; k < steps; ++k) s.step(ones);
  });
  double factor = 0;
  for (std::size_t lag = 0; lag < stats.update_lag.size(); ++lag)
    factor += double(stats.update_lag[lag]) / double(std::max<std::size_t>(1, lag));
  CAPTURE(factor, stats.update_lag);
  REQUIRE(stats.applied == std::uint64_t(workers * steps));
  const auto start = flat<double>(start_params<double>(0));
  REQUIRE(served.size() == start.size());
  for (std::size_t i = 0; i < start.size(); ++i) REQUIRE(served[i] == Approx(start[i] - lr * factor).epsilon(1e-12));
  // Without the option every gradient takes a full step.
  options.staleness_aware_lr = false;
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    S s(t, start_params<double>(t.rank()), gw::optim::sgd({.lr = lr}), S::aggregation_type(options));
    if (s.is_server()) {
      s.serve();
      served = flat<double>(s.parameters());
      return;
    }
    const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                                std::vector<double>(model.outputs, 1.0)};
    for (int k = 0; k < steps; ++k) s.step(ones);
  });
  for (std::size_t i = 0; i < start.size(); ++i) REQUIRE(served[i] == Approx(start[i] - lr * steps).epsilon(1e-12));
}

namespace {
// inproc that counts, per rank, the gradient receives it posted: a server posts one once
// a worker's push header has arrived, so the count says which servers a push reached.
class counting_inproc {
 public:
  using request = gw::transport::inproc::request;
  counting_inproc(gw::transport::inproc t, std::vector<std::atomic<int>>* gradient_receives)
      : t_(std::move(t)), receives_(gradient_receives) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    return t_.async_send(peer, tag, bytes);
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    if (tag == gw::ps::detail::gradient_tag) ++(*receives_)[static_cast<std::size_t>(rank())];
    return t_.async_recv(peer, tag, bytes);
  }
  void wait(request& r, gw::deadline until) { t_.wait(r, until); }
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until) { return t_.wait_any(requests, until); }

 private:
  gw::transport::inproc t_;
  std::vector<std::atomic<int>>* receives_;
};
static_assert(gw::concepts::multiplexing_transport<counting_inproc>);
}  // namespace

TEST_CASE("parameter_server agent pushes a server's shard as soon as that shard's tensors are ready") {
  // One worker, two servers, two tensors that stay whole: each server holds one of them.
  using policy = gw::aggregation::parameter_server<gw::ps::sync>;
  using agent = policy::agent<double, counting_inproc>;
  const std::vector<std::size_t> sizes{48, 40};
  gw::ps::options o;
  o.servers = 2;
  o.timeout = std::chrono::seconds(60);
  const gw::ps::sharding shards(sizes, o.servers, o.split_bytes / sizeof(double));
  REQUIRE(shards.servers_of(0).size() == 1);
  REQUIRE(shards.servers_of(1).size() == 1);
  const int server_of_first = shards.servers_of(0)[0], server_of_second = shards.servers_of(1)[0];
  REQUIRE(server_of_first != server_of_second);
  const int first_rank = 1 + server_of_first, second_rank = 1 + server_of_second;  // rank 0 is the worker

  const double lr = 0.5;
  std::vector<std::atomic<int>> receives(3);
  std::vector<std::vector<double>> final_params;
  std::vector<gw::ps::server_stats> stats(2);
  gw::transport::run_inproc(3, [&](gw::transport::inproc t) {
    gw::collective::communicator<counting_inproc> comm(counting_inproc(std::move(t), &receives));
    std::vector<std::vector<double>> p{std::vector<double>(sizes[0], 1.0), std::vector<double>(sizes[1], 2.0)};
    const std::vector<std::span<double>> params{p[0], p[1]};
    agent a{policy(o)};
    a.setup(comm, params);
    if (a.is_server(comm.rank(), comm.size())) {
      stats[static_cast<std::size_t>(comm.rank() - 1)] = a.serve(comm, params, gw::optim::sgd({.lr = lr}));
      return;
    }
    const std::vector<double> g0(sizes[0], 0.25), g1(sizes[1], -1.0);
    for (int step = 0; step < 2; ++step) {
      a.begin_step(comm);
      a.ready(comm, 0, g0);
      // The first tensor's server has the push (it is receiving the gradient) before the
      // second tensor is ready; the other server has nothing yet. No time limit but the
      // test's: the receive is posted whenever the server's thread gets to it.
      while (receives[static_cast<std::size_t>(first_rank)].load() < step + 1) std::this_thread::yield();
      REQUIRE(receives[static_cast<std::size_t>(second_rank)].load() == step);
      a.ready(comm, 1, g1);
      a.finish_step(comm, params, [](std::size_t, std::span<const double>, double) { FAIL("workers do not apply"); });
      REQUIRE(receives[static_cast<std::size_t>(second_rank)].load() == step + 1);
      REQUIRE(a.version() == std::uint64_t(step + 1));  // sync: the step closed on both servers
      REQUIRE(a.last_staleness() == 0);
    }
    a.finish(comm);
    final_params = p;
  });
  // Two SGD steps on constant gradients, applied by the servers and pulled back.
  for (double v : final_params[0]) REQUIRE(v == Approx(1.0 - 2 * lr * 0.25).epsilon(1e-15));
  for (double v : final_params[1]) REQUIRE(v == Approx(2.0 + 2 * lr * 1.0).epsilon(1e-15));
  for (const auto& st : stats) {
    REQUIRE(st.pushes == std::vector<std::uint64_t>{2});
    REQUIRE(st.version == 2);
    REQUIRE(st.applied == 2);
  }
}

TEST_CASE("parameter_server agent refuses a step out of order and names what is missing") {
  using agent = gw::aggregation::parameter_server<gw::ps::async>::agent<float, gw::transport::inproc>;
  gw::ps::options o;
  o.timeout = std::chrono::seconds(60);
  gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
    gw::collective::communicator<gw::transport::inproc> comm(std::move(t));
    std::vector<float> p0(3, 1.0f), p1(2, 1.0f);
    const std::vector<std::span<float>> params{p0, p1};
    agent a(o);
    a.setup(comm, params);
    if (a.is_server(comm.rank(), comm.size())) {
      REQUIRE_THROWS_WITH(a.begin_step(comm), Catch::Contains("is a server: call serve()"));
      a.serve(comm, params, gw::optim::sgd({.lr = 0.1}));
      return;
    }
    const std::vector<float> g0(3, 1.0f), g1(2, 1.0f);
    REQUIRE_THROWS_WITH(a.ready(comm, 0, g0), Catch::Contains("outside a step"));
    a.begin_step(comm);
    a.ready(comm, 1, g1);
    REQUIRE_THROWS_WITH(a.ready(comm, 1, g1), Catch::Contains("gradient 1 was ready twice"));
    REQUIRE_THROWS_WITH(a.finish_step(comm, params, [](std::size_t, std::span<const float>, float) {}),
                        Catch::Contains("before gradient 0 was ready"));
    a.ready(comm, 0, g0);
    a.finish_step(comm, params, [](std::size_t, std::span<const float>, float) {});
    REQUIRE(a.applied() == 1);
    REQUIRE(p0[0] == Approx(0.9f));
    a.finish(comm);  // what strategy<>'s destructor does: the server stops waiting
  });
}
