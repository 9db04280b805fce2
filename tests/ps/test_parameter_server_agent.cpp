// Parameter servers on threads (inproc), continued from test_parameter_server.cpp: the agent
// pushes each server's shard as soon as its tensors are ready and refuses steps out of order,
// and the async mode over transport::any_transport gives inproc's parameters step by step.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <gradwire/gradwire.hpp>
#include <gradwire/transport/any.hpp>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parameter_server_support.hpp"
#include "helpers/errors.hpp"

using gradwire::test::is_error;
using namespace gradwire::test::parameter_server_support;

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

TEST_CASE("aggregation::parameter_server says how many servers it has and which ranks serve, standbys last") {
  // What a program reads to split its ranks (examples/fashion_mnist: workers = size - servers()).
  for (const bool standby : {false, true}) {
    CAPTURE(standby);
    gw::ps::options o;
    o.servers = 3;
    o.standby = standby;
    const gw::aggregation::parameter_server<gw::ps::async> policy(o);
    CHECK(policy.servers() == 3);
    CHECK(policy.options().servers == 3);
    const int size = 10, serving = standby ? 6 : 3;  // the servers, then as many standbys
    CHECK(policy.first_server(size) == size - serving);
    for (int r = 0; r < size; ++r) CHECK(policy.is_server(r, size) == (r >= size - serving));
  }
}

TEST_CASE("a standby's acknowledgement is taken only for the next update sent, at the version it took the server to") {
  // The server has sent 5 updates to its standby, which acknowledged 3: the next
  // acknowledgement must be of update 4, at version 40 (what update 4 took the server to).
  // A sync server answers pulls up to the version acknowledged, so taking any other would
  // answer pulls for a version the standby does not have (a failover would lose it).
  namespace ps = gw::ps::detail;
  const auto decode = [](const ps::replica_ack& a, std::uint64_t acked, std::uint64_t replicated) {
    return ps::decode_replica_ack(ps::bytes_of(a), 3, 7, acked, replicated, 40);
  };
  const ps::replica_ack next = decode({40, 4}, 3, 5);
  CHECK((next.version == 40 && next.updates == 4));
  for (const auto& [ack, acked, replicated] :
       {std::tuple{ps::replica_ack{40, 5}, 3u, 5u},    // a later update than the next
        std::tuple{ps::replica_ack{40, 3}, 3u, 5u},    // the one acknowledged already
        std::tuple{ps::replica_ack{41, 4}, 3u, 5u},    // another version
        std::tuple{ps::replica_ack{40, 4}, 3u, 3u},    // nothing sent is unacknowledged
        std::tuple{ps::replica_ack{40, 4}, 4u, 3u}}) {  // more acknowledged than sent
    CAPTURE(ack.version, ack.updates, acked, replicated);
    const auto [kind, what] = gw::testing::error_of([&] { (void)decode(ack, acked, replicated); });
    CHECK(kind == gw::errc::protocol);
    CHECK_THAT(what, Catch::Contains("parameter server rank 3: standby rank 7 acknowledged update " +
                                     std::to_string(ack.updates) + " at version " + std::to_string(ack.version)));
    CHECK_THAT(what, Catch::Contains("expected update " + std::to_string(acked + 1) + " of " + std::to_string(replicated)));
  }
  const std::vector<std::byte> short_message(sizeof(ps::replica_ack) - 1);
  const auto [kind, what] = gw::testing::error_of([&] { (void)ps::decode_replica_ack(short_message, 3, 7, 3, 5, 40); });
  CHECK(kind == gw::errc::protocol);
  CHECK_THAT(what, Catch::Contains("in a 15-byte message"));
}

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

TEST_CASE("parameter_server<async> over transport::any_transport gives inproc's parameters, step by step, on a fixed schedule") {
  // The workers step one at a time in a fixed order, so the servers apply the same
  // gradients in the same order whatever the transport: the erased one must give inproc's
  // parameters bit for bit, and both a float64 reference of the same schedule (each worker's
  // gradient taken at the parameters its previous step pulled; momentum on the servers).
  const int workers = 3, servers = 2, steps = 8;
  const gw::optim::momentum opt({.lr = 0.05, .momentum = 0.9});
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  const auto direct = async_in_turns<gw::transport::inproc>(workers, servers, opt, data);
  const auto erased = async_in_turns<gw::transport::any_transport>(workers, servers, opt, data);

  const std::size_t weights = model.outputs * model.inputs;
  std::vector<double> w = flat<double>(start_params<double>(0)), velocity(w.size(), 0.0);
  std::vector<std::vector<double>> pulled(static_cast<std::size_t>(workers), w);  // each worker's copy
  for (std::size_t k = 0; k < std::size_t(steps); ++k)
    for (int v = 0; v < workers; ++v) {
      CAPTURE(k, v);
      auto& mine = pulled[std::size_t(v)];
      const auto g = model.gradients<double>(mine.data(), mine.data() + weights, data[k][std::size_t(v)]);
      for (std::size_t i = 0; i < w.size(); ++i) {
        velocity[i] = 0.9 * velocity[i] + (i < weights ? g[0][i] : g[1][i - weights]);
        w[i] -= 0.05 * velocity[i];
      }
      mine = w;
      REQUIRE(direct[std::size_t(v)].size() == std::size_t(steps));
      REQUIRE(erased[std::size_t(v)].size() == std::size_t(steps));
      REQUIRE(erased[std::size_t(v)][k] == direct[std::size_t(v)][k]);  // element by element, exactly
      require_close_to_largest(direct[std::size_t(v)][k], w);
    }
}

TEST_CASE("parameter_server: a server that hears from no worker for ps::options::timeout fails with timeout, naming its rank, the time and the workers it expects") {
  // The workers are held by the test (they never step) until the server has given up.
  const int workers = 2;
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::async>;
  auto options = small_shards(1);
  options.timeout = std::chrono::milliseconds(500);
  std::mutex m;
  std::condition_variable cv;
  bool server_failed = false;
  std::chrono::steady_clock::duration served_for{};
  auto run = [&] {
    gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
      S s(t, start_params<float>(t.rank()), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(options));
      if (s.is_server()) {
        const auto began = std::chrono::steady_clock::now();
        try {
          s.serve();
        } catch (const gw::error&) {
          served_for = std::chrono::steady_clock::now() - began;
          {
            std::lock_guard lock(m);
            server_failed = true;
          }
          cv.notify_all();
          throw;
        }
        return;  // served without a timeout: the workers' hold below fails the run
      }
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, hold_limit, [&] { return server_failed; }))
        throw std::runtime_error("test: the server did not time out while its workers were held");
    });
  };
  REQUIRE_THROWS_MATCHES(run(), gw::error,
                         is_error(gw::errc::timeout, {"parameter server rank 2: no worker sent anything for 500 ms "
                                                      "(2 still expected); are they stuck, or is the timeout too short?"}));
  REQUIRE(served_for >= options.timeout);
}

TEST_CASE("parameter_server: ps::options::learning_rate with an optimizer without set_lr(double) fails with invalid_argument, and with set_lr it sets the lr of every update") {
  const int steps = 3;
  const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                              std::vector<double>(model.outputs, 1.0)};
  auto schedule = small_shards(1);
  schedule.learning_rate = [](std::uint64_t, std::uint64_t) { return 0.25; };
  // One worker stepping `steps` times with gradients of ones; the server's final parameters.
  auto train = [&]<class Optimizer>(const Optimizer& opt, const gw::ps::options& o) {
    using S = gw::parameter_server<gw::host_tensor<double>, Optimizer, gw::ps::sync>;
    std::vector<double> served;
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      S s(t, start_params<double>(t.rank()), opt, typename S::aggregation_type(o));
      if (s.is_server()) {
        s.serve();
        served = flat<double>(s.parameters());
        return;
      }
      for (int k = 0; k < steps; ++k) s.step(ones);
    });
    return served;
  };
  REQUIRE_THROWS_MATCHES(train(fixed_lr_sgd{0.01}, schedule), gw::error,
                         is_error(gw::errc::invalid_argument,
                                  {"parameter_server: ps::options::learning_rate needs an optimizer with set_lr(double)"}));
  const auto start = flat<double>(start_params<double>(0));
  const auto own_lr = train(fixed_lr_sgd{0.01}, small_shards(1));  // without the schedule it trains at its own lr
  const auto scheduled = train(gw::optim::sgd({.lr = 0.01}), schedule);  // with set_lr, at the schedule's
  REQUIRE(own_lr.size() == start.size());
  REQUIRE(scheduled.size() == start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    CAPTURE(i);
    REQUIRE(own_lr[i] == Approx(start[i] - steps * 0.01).epsilon(1e-12));
    REQUIRE(scheduled[i] == Approx(start[i] - steps * 0.25).epsilon(1e-12));
  }
}

TEST_CASE("parameter_server: serve(schedule) sets the lr of every update from the schedule, and a schedule also in ps::options::learning_rate is refused") {
  const int steps = 3;
  const std::vector<std::vector<double>> ones{std::vector<double>(model.outputs * model.inputs, 1.0),
                                              std::vector<double>(model.outputs, 1.0)};
  // lr = 0.1 * (applied + 1): each update's rate differs, so the result shows that every
  // update took the rate the schedule gave it then.
  const auto schedule = [](std::uint64_t, std::uint64_t applied) { return 0.1 * double(applied + 1); };
  using S = gw::parameter_server<gw::host_tensor<double>, gw::optim::sgd, gw::ps::sync>;
  auto train = [&](const gw::ps::options& o) {
    std::vector<double> served;
    gw::transport::run_inproc(2, [&](gw::transport::inproc t) {
      S s(t, start_params<double>(t.rank()), gw::optim::sgd({.lr = 0.01}), S::aggregation_type(o));
      if (s.is_server()) {
        s.serve(schedule);
        served = flat<double>(s.parameters());
        return;
      }
      for (int k = 0; k < steps; ++k) s.step(ones);
    });
    return served;
  };
  const auto start = flat<double>(start_params<double>(0));
  const auto scheduled = train(small_shards(1));
  // The reference: update k moves each parameter by its rate. ps::sync counts a step's
  // gradients as applied when it closes the step, just before the update: k + 1 of them.
  double moved = 0;
  for (int k = 0; k < steps; ++k) moved += 0.1 * double(k + 2);
  REQUIRE(scheduled.size() == start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    CAPTURE(i);
    REQUIRE(scheduled[i] == Approx(start[i] - moved).epsilon(1e-12));
  }
  auto twice = small_shards(1);
  twice.learning_rate = schedule;
  REQUIRE_THROWS_MATCHES(train(twice), gw::error,
                         is_error(gw::errc::invalid_argument,
                                  {"parameter_server: a learning-rate schedule given twice, in ps::options::learning_rate "
                                   "and to serve(schedule); give one"}));
}

TEST_CASE("parameter_server: serve() on a worker rank fails with invalid_argument naming the rank, and the job goes on") {
  const int workers = 2, steps = 3;
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync>;
  const std::uint64_t seed = gw::test::fresh_seed();
  CAPTURE(seed);
  const auto data = make_batches(steps, workers, seed);
  std::vector<std::pair<gw::errc, std::string>> refused(static_cast<std::size_t>(workers), {gw::errc{}, "serve() returned"});
  std::vector<std::vector<float>> history(static_cast<std::size_t>(steps));
  gw::ps::server_stats stats;
  gw::transport::run_inproc(workers + 1, [&](gw::transport::inproc t) {
    const int me = t.rank();
    S s(t, start_params<float>(me), gw::optim::sgd({.lr = 0.1}), S::aggregation_type(small_shards(1)));
    if (s.is_server()) {
      stats = s.serve();
      return;
    }
    try {
      s.serve();
    } catch (const gw::error& e) {
      refused[std::size_t(me)] = {e.kind(), e.what()};
    }
    for (int k = 0; k < steps; ++k) {
      const auto p = s.parameters();
      s.step(model.gradients<float>(p[0].data(), p[1].data(), data[std::size_t(k)][std::size_t(me)]));
      if (me == 0) history[std::size_t(k)] = flat<float>(s.parameters());
    }
  });
  for (int w = 0; w < workers; ++w) {
    CAPTURE(w, refused[std::size_t(w)].second);
    REQUIRE(refused[std::size_t(w)].first == gw::errc::invalid_argument);
    REQUIRE_THAT(refused[std::size_t(w)].second,
                 Catch::Contains("parameter_server: rank " + std::to_string(w) +
                                 " is a worker: serve() is for the server ranks (the last 1)"));
  }
  // The refused call changed nothing: the job trains as all-reduce does.
  REQUIRE(stats.pushes == std::vector<std::uint64_t>(std::size_t(workers), std::uint64_t(steps)));
  require_trajectories_close(history, train_mirrored<float>(workers, gw::optim::sgd({.lr = 0.1}), data));
}
