// One rank of a parameter-server test, started by scripts/gradwire-run --ps S over loopback TCP or UCX (or by
// mpirun -x GRADWIRE_NUM_PS=S over MPI).
//
//   ps_worker sync                 sync PS == all-reduce training (a serial reference on the chief)
//   ps_worker async                async converges; servers check their accounting
//   ps_worker bounded S            a slow worker that lets the others lead by S; servers check staleness <= S
//   ps_worker backup               backup_workers<1>, a slow worker that is always late; drops counted exactly
//   ps_worker kill K               async; worker K is killed mid-run; the rest finish
//   ps_worker rejoin K             async; worker K is killed mid-run and test_ps_elastic.py starts its
//                                  replacement (GRADWIRE_REJOIN=1), which the servers take back
//   ps_worker server-loss DIR [async]
//                                  sync (or async) with checkpoints in DIR; the last server is killed at version 12
//   ps_worker rejoin-mid-push K    as rejoin, but the servers hold right after worker K's 10th gradient
//                                  (held_tcp: asio_tcp only) until the test has killed K and they have
//                                  seen the loss: a worker lost mid-push, at a chosen point
//   ps_worker lose-worker sync|backup K
//                                  sync or backup_workers<1>; worker K raises SIGKILL at its step 5; every
//                                  other rank expects peer_lost
//   ps_worker bounded-kill K       bounded_staleness<2>; worker K lags (as in `bounded`) and raises SIGKILL
//                                  at its push 6, once the others wait at the gate; they must go on.
//                                  Every worker checks, from its own count of pushes and the version its
//                                  pulls returned, that it never led by more than 2 (LEADS line)
//   ps_worker sync-rejoin K        sync; worker K raises SIGKILL at step 5; rank 0 then holds (its store
//                                  serving) until $GW_TEST_SYNC_DIR/release exists, for a replacement
//   ps_worker finish-early K       async; worker K finishes normally after 5 steps (it says goodbye); the
//                                  others train until $GW_TEST_SYNC_DIR/release exists
//   ps_worker servers-finish K     async; worker K raises SIGKILL at step 5; the others train 30 steps;
//                                  rank 0 tells the servers it finished, then holds until released
//   ps_worker resume DIR           sync from the checkpoints in DIR
//   ps_worker failover sync|async VICTIM WHEN [STEPS [DIR]]
//                                  servers with standbys (the launcher's ps ranks: the servers, then
//                                  as many standbys); rank VICTIM (-1: none) is killed with SIGKILL,
//                                  WHEN = update:K just before its K-th update (a deterministic point),
//                                  ms:D D ms into serving, or (sync, asio_tcp only) request:1 once it
//                                  received its first request, a worker's first pull, before any push
//                                  (held_tcp); STEPS (default 60) of 10 ms. Workers
//                                  print "training" once set up, and a hash of their final
//                                  parameters (params=), to compare with an uninterrupted run's.
//                                  DIR: checkpoints there, the standbys' in DIR/standby (a
//                                  standby that resumes from another checkpoint than its server).
//
// The slow worker of `bounded` and `backup` lags on purpose, not by sleeping: it waits for
// what the other workers write to $GW_TEST_SYNC_DIR after each step (see plan::lag).
//
// Ranks print "rank R: PASS ..." (or "EXPECTED <errc>: ...") and exit 0, or "FAIL ..." and
// exit 1; servers also print "rank R: STATS k=v ..." for test_ps.py to cross-check, and
// the lagging worker "rank R: LAGGED k=v ...".
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gradwire/asio.hpp>
#if GRADWIRE_TEST_UCX
#include <gradwire/ucx.hpp>
#endif
#if GRADWIRE_TEST_MPI
#include <gradwire/mpi.hpp>
#endif
#include <gradwire/gradwire.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers/least_squares.hpp"

namespace gw = gradwire;
using gw::testing::batch_data;
// Built three times: over Boost.Asio TCP (ps_worker), UCX (ps_worker_ucx) and MPI (ps_worker_mpi).
#if GRADWIRE_TEST_UCX
using transport_type = gw::transport::ucx;
transport_type join_job() { return gw::cluster::join_ucx(); }
constexpr bool survives_lost_peers = true;
#elif GRADWIRE_TEST_MPI  // ps_worker_mpi: the synchronous modes (MPI cannot go on without a lost rank)
using transport_type = gw::transport::mpi;
transport_type join_job() { return gw::transport::mpi(); }
constexpr bool survives_lost_peers = false;
#else
using transport_type = gw::transport::asio_tcp;
transport_type join_job() { return gw::cluster::join_tcp(); }
constexpr bool survives_lost_peers = true;
#endif
// What these tests exercise: servers wait on whichever worker speaks first, and in
// async modes survive a worker's loss.
static_assert(gw::concepts::multiplexing_transport<transport_type> &&
              (!survives_lost_peers || gw::concepts::loss_tolerant_transport<transport_type>));
// The parameter server's agent over this transport fits every concept strategy<> uses it through.
using ps_agent = gw::aggregation::parameter_server<gw::ps::async>::agent<float, transport_type>;
static_assert(gw::concepts::aggregation_agent<ps_agent, float, transport_type> &&
              gw::concepts::serving_agent<ps_agent, float, transport_type, gw::optim::sgd> &&
              gw::concepts::finishing_agent<ps_agent, transport_type> &&
              gw::concepts::staleness_reporting_agent<ps_agent>);

namespace {

int my_rank = -1;
const gw::testing::least_squares model{16, 4, 8};

[[noreturn]] void fail(const std::string& what) {
  std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

// Worker w's batch at step k: a learnable target (y = A x + c + noise), the same on every rank.
batch_data batch(int w, int k) {
  std::mt19937_64 teacher(42);
  std::normal_distribution<double> dist;
  std::vector<double> a(model.outputs * model.inputs), c(model.outputs);
  for (auto& v : a) v = dist(teacher);
  for (auto& v : c) v = dist(teacher);
  std::mt19937_64 gen(1000003ull * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(w));
  batch_data d = model.random_batch(gen);
  model.fit_targets(d, a, c, 0.01, gen);
  return d;
}

std::vector<gw::host_tensor<float>> start_params(int rank) {
  std::vector<gw::host_tensor<float>> p;
  p.emplace_back(gw::shape{model.outputs * model.inputs});
  p.emplace_back(gw::shape{model.outputs});
  for (std::size_t i = 0; i < p[0].size(); ++i) p[0][i] = rank == 0 ? float(0.1 * std::sin(double(i))) : 99.f;
  for (std::size_t i = 0; i < p[1].size(); ++i) p[1][i] = rank == 0 ? 0.f : -99.f;
  return p;
}

double loss(std::span<const gw::host_tensor<float>> p) {
  double sum = 0;
  for (int k = 0; k < 8; ++k) {
    const batch_data d = batch(1000, k);  // held out
    for (std::size_t n = 0; n < model.batch; ++n)
      for (std::size_t o = 0; o < model.outputs; ++o) {
        double r = double(p[1][o]) - d.y[n * model.outputs + o];
        for (std::size_t i = 0; i < model.inputs; ++i) r += double(p[0][o * model.inputs + i]) * d.x[n * model.inputs + i];
        sum += 0.5 * r * r;
      }
  }
  return sum / (8.0 * model.batch);
}

// FNV-1a over the parameters' bytes: equal hashes, bit-identical parameters.
std::uint64_t hash_of(std::span<const gw::host_tensor<float>> p) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& t : p)
    for (std::size_t i = 0; i < t.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &t[i], sizeof bits);
      for (int b = 0; b < 4; ++b) h = (h ^ ((bits >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
  return h;
}

std::string join(const std::vector<std::uint64_t>& v) {
  std::string s;
  for (auto x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

struct plan {
  int steps = 30;
  int slow_rank = -1;  // this worker sleeps slow_ms before each step (or lags: see `lag`)
  int slow_ms = 0;
  // The slow worker lags explicitly, on what the others report after each step (files in
  // $GW_TEST_SYNC_DIR): under bounded_staleness<s>, before its push number k+1 it waits
  // until every other worker has finished its step k+s (a lead of s: their next pull is
  // held), and checks that none went further; under backup_workers<b>, before pushing for
  // the step it holds it waits until that step has closed without it (another worker
  // holds a later version), so its gradient is late.
  bool lag = false;
  int pace_ms = 0;     // every worker sleeps this long before each step (a compute stand-in)
  int kill_rank = -1;  // this worker raises SIGKILL at step kill_step
  int kill_step = 5;
  bool until_applied = false;  // train until the servers applied steps * (workers - backups) gradients
  bool until_loss_seen = false;  // train past `steps` until a server reports a lost worker (at most 50 x steps)
  bool kill_after_lag = false;  // the slow worker raises SIGKILL at kill_step after its lag (others at the gate)
  bool until_released = false;  // train until $GW_TEST_SYNC_DIR/release exists (at least 30, at most `steps`)
  int finish_rank = -1;         // this worker stops (and finishes normally) after finish_after steps
  int finish_after = 5;
  int hold_rank = -1;           // this worker holds until released: on a lost peer, or after training
};

// $GW_TEST_SYNC_DIR/release: the test's signal that a holding rank may go on.
bool released() {
  const char* dir = std::getenv("GW_TEST_SYNC_DIR");
  return dir && *dir && std::filesystem::exists(std::string(dir) + "/release");
}
// Holds this rank (its transport, and on rank 0 the rendezvous store, still up) until the
// test releases it; FAIL after a minute.
void hold_until_released(const char* why) {
  std::printf("rank %d: HOLDING %s\n", my_rank, why);
  std::fflush(stdout);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!released()) {
    if (std::chrono::steady_clock::now() > give_up) fail("held a minute and was never released");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a bounded poll of the test's signal
  }
}

// $GW_TEST_SYNC_DIR/serving<R>: serving rank R has begun serving (run() writes it).
void say_serving(int rank) {
  if (const char* dir = std::getenv("GW_TEST_SYNC_DIR"); dir && *dir)
    std::ofstream(std::string(dir) + "/serving" + std::to_string(rank)) << "1\n";
}
// Polls until every rank in [first, size) has begun serving; FAIL after a minute.
void serving_everywhere(int first, int size) {
  const char* dir = std::getenv("GW_TEST_SYNC_DIR");
  if (!dir || !*dir) fail("this mode needs GW_TEST_SYNC_DIR (test_ps.py sets it)");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = first; r < size; ++r)
    while (!std::filesystem::exists(std::string(dir) + "/serving" + std::to_string(r))) {
      if (std::chrono::steady_clock::now() > give_up) fail("rank " + std::to_string(r) + " never began serving");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded poll of the others' files
    }
}

bool is_replacement() {
  const char* r = std::getenv("GRADWIRE_REJOIN");
  return r && std::string(r) == "1";
}

std::chrono::milliseconds ps_timeout{std::chrono::seconds(60)};  // ps::options::timeout, and the lag's wait

// What each worker reports after each step (plan::lag): one line "VALUE FINISHED" in
// $GW_TEST_SYNC_DIR/worker<R>, written aside and renamed into place. VALUE: the steps it
// finished (bounded_staleness) or the version it holds (backup_workers).
class progress_board {
 public:
  progress_board(bool on, int rank, int workers) : on_(on), rank_(rank), workers_(workers) {
    if (!on_) return;
    const char* dir = std::getenv("GW_TEST_SYNC_DIR");
    if (!dir || !*dir) fail("this mode needs GW_TEST_SYNC_DIR, a directory the workers share (test_ps.py sets it)");
    dir_ = dir;
  }
  void publish(std::uint64_t value, bool finished) const {
    if (!on_) return;
    const std::string path = dir_ + "/worker" + std::to_string(rank_);
    {
      std::ofstream f(path + ".part");
      f << value << ' ' << (finished ? 1 : 0) << '\n';
      if (!f) fail("cannot write " + path);
    }
    std::filesystem::rename(path + ".part", path);
  }
  // f(worker, value, finished) for every other worker's latest report (0, unfinished, before its first).
  template <class F>
  void for_each(F&& f) const {
    for (int w = 0; w < workers_; ++w) {
      if (w == rank_) continue;
      std::uint64_t value = 0;
      int finished = 0;
      std::ifstream(dir_ + "/worker" + std::to_string(w)) >> value >> finished;
      f(w, value, finished != 0);
    }
  }
  // Polls `ready` every millisecond until it holds; FAIL after ps_timeout (a minute by default).
  template <class F>
  void await(const std::string& what, F&& ready) const {
    const auto give_up = std::chrono::steady_clock::now() + ps_timeout;
    while (!ready()) {
      if (std::chrono::steady_clock::now() > give_up)
        fail("waited " + std::to_string(ps_timeout.count()) + " ms for " + what);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded poll of the others' reports
    }
  }

 private:
  bool on_;
  int rank_, workers_;
  std::string dir_;
};

constexpr float lr = 0.05f;
std::uint64_t calls = 0;  // updates a server is about to make (failover: the victim's count)
int kill_after_ms = -1;   // failover ms:D: a server or standby raises SIGKILL D ms into serving

#if !GRADWIRE_TEST_UCX && !GRADWIRE_TEST_MPI
// asio_tcp that stops a server at one chosen point, a point a plain run reaches only by
// luck (over TCP a loss is seen only inside a wait):
// - held_tcp(t, victim, at): right after it received worker `victim`'s gradient number
//   `at`, it says so ("HOLDING ...", the test then kills that worker) and waits, on a
//   receive nobody sends, until its engine has seen the loss; the server then goes on with
//   a push whose worker it knows is lost;
// - held_tcp(t, dies_at_first_request): it raises SIGKILL once the server has received its
//   first request (a worker's first pull, from strategy<>'s constructor): after its standby
//   confirmed the shard, before any worker has pushed, and once every serving rank serves
//   (past the setup in which a peer's loss is still fatal to it: serving_everywhere).
class held_tcp : public gw::transport::asio_tcp {
 public:
  explicit held_tcp(gw::transport::asio_tcp&& t, int victim = -1, int at = 0)
      : asio_tcp(std::move(t)), victim_(victim), at_(at) {}
  held_tcp(gw::transport::asio_tcp&& t, bool dies_at_first_request, int first_server = 0)
      : asio_tcp(std::move(t)), dies_(dies_at_first_request), first_server_(first_server) {}

  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    auto r = asio_tcp::async_recv(peer, tag, bytes);
    if (peer == victim_ && tag == gw::ps::detail::gradient_tag && ++gradients_ == at_) held_ = r.peek();
    if (dies_ && tag == gw::ps::detail::request_tag) requests_.push_back(r.peek());
    return r;
  }
  void wait(request& r, gw::deadline until) {
    const bool hold = held_ != nullptr && r.peek() == held_;
    if (hold) held_ = nullptr;  // once, even if this wait throws
    const bool dies = std::ranges::count(requests_, r.peek()) > 0;  // the first waited for: none died before
    asio_tcp::wait(r, until);
    if (dies) {
      serving_everywhere(first_server_, size());
      std::raise(SIGKILL);
    }
    if (hold) hold_until_lost();
  }

 private:
  void hold_until_lost() {
    std::printf("rank %d: HOLDING after worker %d's gradient %d\n", rank(), victim_, at_);
    std::fflush(stdout);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto lost = [&] { return std::ranges::count(lost_peers(), victim_) > 0; };
    while (!lost()) {
      if (std::chrono::steady_clock::now() > give_up)
        ::fail("held a minute: worker " + std::to_string(victim_) + " was never lost");
      std::byte none{};
      auto probe = asio_tcp::async_recv(victim_, probe_tag, {&none, 1});
      try {
        asio_tcp::wait(probe, gw::clock::now() + std::chrono::milliseconds(20));  // the engine reads meanwhile
      } catch (const gw::error&) {  // a timeout (withdrawn), or the loss itself
      }
    }
    std::printf("rank %d: HELD until its transport lost worker %d\n", rank(), victim_);
    std::fflush(stdout);
  }

  // Below the parameter server's tags (ps::detail::tag_base), above any collective's of a
  // job this short (sequence << 16), within the 48 bits every transport carries.
  static constexpr std::uint64_t probe_tag = 1ull << 40;
  int victim_ = -1, at_ = 0, gradients_ = 0;
  const void* held_ = nullptr;
  bool dies_ = false;
  int first_server_ = 0;
  std::vector<const void*> requests_;  // request receives posted (dies_)
};
static_assert(gw::concepts::rejoinable_transport<held_tcp> && gw::concepts::multiplexing_transport<held_tcp>);
#endif

template <class Mode, class Transport = transport_type>
void run(const gw::cluster::cluster_spec& spec, gw::ps::options options, const plan& p,
         void (*check_server)(const gw::ps::server_stats&, int workers) = nullptr, Transport (*join_as)() = join_job) {
  using S = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, Mode, Transport>;
  options.servers = spec.count(gw::cluster::task_type::ps) / (options.standby ? 2 : 1);
  options.split_bytes = 64;  // split the weight matrix over the servers
  options.timeout = ps_timeout;
  const int workers = spec.world_size - options.serving_ranks();
  S s(join_as(), start_params(spec.rank), gw::optim::sgd({.lr = lr}), typename S::aggregation_type(options));
  if (s.is_server()) {
    say_serving(spec.rank);
    if (kill_after_ms >= 0)  // timed from the start of serving, not of the process: setup may be slow
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
        std::raise(SIGKILL);
      }).detach();
    const auto st = s.serve();
    std::uint64_t max_staleness = st.staleness.empty() ? 0 : st.staleness.size() - 1;
    const std::string lost = join(std::vector<std::uint64_t>(st.lost_workers.begin(), st.lost_workers.end()));
    const std::string rejoined =
        join(std::vector<std::uint64_t>(st.rejoined_workers.begin(), st.rejoined_workers.end()));
    const bool standby = spec.rank >= workers + options.servers;
    std::printf("rank %d: STATS resumed=%llu version=%llu applied=%llu dropped=%llu pushes=%s dropped_by=%s "
                "max_staleness=%llu max_lead=%llu lost=%s rejoined=%s one_sided=%llu role=%s promoted=%d "
                "promoted_at=%llu standby_lost=%d replicated=%llu resent=%llu staleness=%s\n",
                spec.rank, (unsigned long long)st.resumed_from, (unsigned long long)st.version,
                (unsigned long long)st.applied, (unsigned long long)st.dropped, join(st.pushes).c_str(),
                join(st.dropped_by).c_str(), (unsigned long long)max_staleness, (unsigned long long)st.max_lead,
                lost.c_str(), rejoined.c_str(), (unsigned long long)st.one_sided, standby ? "standby" : "server",
                st.promoted ? 1 : 0, (unsigned long long)st.promoted_at, st.standby_lost ? 1 : 0,
                (unsigned long long)st.replicated, (unsigned long long)st.resent, join(st.staleness).c_str());
    std::uint64_t pushes = 0;
    for (auto x : st.pushes) pushes += x;
    // (A standby's applied count includes the gradients of its server's updates, and a standby
    // that took over counts the gradients resent for a step it had apart.)
    if (st.applied - st.replicated + st.dropped + st.resent != pushes)
      fail("applied - replicated + dropped + resent != gradients received");
    if (check_server) check_server(st, workers);
    std::printf("rank %d: PASS server\n", spec.rank);
    return;
  }
  const double before = loss(s.parameters());
  std::printf("rank %d: training\n", spec.rank);
  std::fflush(stdout);
  std::uint64_t pushes = 0;
  const std::uint64_t budget = static_cast<std::uint64_t>(p.steps) * (workers - Mode::backups);
  progress_board board(p.lag, spec.rank, workers);
  std::uint64_t lagged = 0;  // steps at which the slow worker saw the lead of s, or its step closed without it
  // Bounded staleness, from this worker's own records: its pushes, and the version each pull
  // returned (the slowest live worker's clock): pushes - version is its lead, at most s.
  std::uint64_t max_lead = 0, at_bound = 0, after_loss = 0;
  const bool count_leads = Mode::max_lead >= 0 && !is_replacement();
  try {
    auto more = [&](int k) {
      if (p.until_applied) return s.aggregation().applied() < budget;
      if (k < p.steps) return true;
      if (!p.until_loss_seen || s.aggregation().lost_workers() > 0) return false;
      if (k >= 50 * p.steps) fail("no server reported the lost worker in " + std::to_string(k) + " steps");
      return true;
    };
    for (int k = 0; more(k); ++k) {
      if (p.until_released && k >= 30 && released()) break;  // (30 steps: enough for the loss to fall)
      if (spec.rank == p.finish_rank && k == p.finish_after) break;
      if (spec.rank == p.kill_rank && k == p.kill_step && !p.kill_after_lag) std::raise(SIGKILL);
      if (spec.rank == p.slow_rank && p.lag) {
        if constexpr (Mode::max_lead >= 0) {
          // This worker has pushed k gradients: the others can finish steps up to k + s, no further.
          const auto lead = static_cast<std::uint64_t>(Mode::max_lead), pushed = static_cast<std::uint64_t>(k);
          const std::uint64_t target = std::min(pushed + lead, static_cast<std::uint64_t>(p.steps));
          board.await("every other worker to finish step " + std::to_string(target), [&] {
            bool all = true;
            board.for_each([&](int w, std::uint64_t done, bool) {
              if (done > pushed + lead)
                fail("worker " + std::to_string(w) + " finished step " + std::to_string(done) +
                     " while this one had pushed " + std::to_string(pushed) + ": more than s = " + std::to_string(lead) +
                     " ahead");
              all = all && done >= target;
            });
            return all;
          });
          lagged += target == pushed + lead;
          if (spec.rank == p.kill_rank && k == p.kill_step && p.kill_after_lag) {
            std::printf("rank %d: DYING at push %d: every other worker finished step %llu\n", spec.rank, k,
                        (unsigned long long)target);
            std::fflush(stdout);
            std::raise(SIGKILL);
          }
        } else if constexpr (Mode::backups > 0) {
          // The step this worker would push for closes with the others' gradients.
          const std::uint64_t v = s.aggregation().version();
          bool closed = false;
          board.await("step " + std::to_string(v) + " to close without this worker", [&] {
            bool all_finished = true;
            board.for_each([&](int, std::uint64_t version, bool finished) {
              closed = closed || version > v;
              all_finished = all_finished && finished;
            });
            return closed || all_finished;
          });
          if (!closed)
            fail("the other workers finished, but step " + std::to_string(v) + " never closed without this one");
          ++lagged;
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(spec.rank == p.slow_rank ? p.slow_ms : p.pace_ms));
      }
      const auto params = s.parameters();
      s.step(model.gradients<float>(params[0].data(), params[1].data(), batch(spec.rank, k)));
      ++pushes;
      if (count_leads) {
        const std::uint64_t v = s.aggregation().version(), lead = pushes - std::min(pushes, v);
        if (lead > static_cast<std::uint64_t>(Mode::max_lead))
          fail("after push " + std::to_string(pushes) + " the pull returned version " + std::to_string(v) +
               ": a lead of " + std::to_string(lead) + ", more than s = " + std::to_string(Mode::max_lead));
        max_lead = std::max(max_lead, lead);
        at_bound += lead == static_cast<std::uint64_t>(Mode::max_lead);
        after_loss += s.aggregation().lost_workers() > 0;
      }
      board.publish(Mode::backups > 0 ? s.aggregation().version() : static_cast<std::uint64_t>(k + 1), false);
    }
  } catch (const gw::error& e) {
    if (spec.rank == p.hold_rank && e.kind() == gw::errc::peer_lost) {
      std::printf("rank %d: EXPECTED %s: %s\n", spec.rank, gw::make_error_code(e.kind()).message().c_str(), e.what());
      hold_until_released("after a lost peer");
    }
    throw;
  }
  if (count_leads)
    std::printf("rank %d: LEADS max=%llu at_bound=%llu after_loss=%llu steps=%llu\n", spec.rank,
                (unsigned long long)max_lead, (unsigned long long)at_bound, (unsigned long long)after_loss,
                (unsigned long long)pushes);
  if (spec.rank == p.hold_rank) {
    s.aggregation().finish(s.communicator());  // the servers stop waiting for it; its transport stays up
    hold_until_released("after training");
  }
  board.publish(Mode::backups > 0 ? s.aggregation().version() : pushes, true);
  if (spec.rank == p.slow_rank && p.lag) {
    std::printf("rank %d: LAGGED %s=%llu\n", spec.rank, Mode::backups > 0 ? "late" : "lead_reached",
                (unsigned long long)lagged);
    std::fflush(stdout);
  }
  const double after = loss(s.parameters());
  if constexpr (std::is_same_v<Mode, gw::ps::sync>) {
    if (spec.rank == 0 && options.checkpoint_dir.empty()) {
      // The all-reduce reference, computed serially: the mean of every worker's gradient, one SGD step.
      auto ref = start_params(0);
      for (int k = 0; k < p.steps; ++k) {
        std::vector<std::vector<double>> mean{std::vector<double>(ref[0].size()), std::vector<double>(ref[1].size())};
        for (int w = 0; w < workers; ++w) {
          const auto g = model.gradients<float>(ref[0].data(), ref[1].data(), batch(w, k));
          for (std::size_t t = 0; t < 2; ++t)
            for (std::size_t i = 0; i < g[t].size(); ++i) mean[t][i] += double(g[t][i]) / workers;
        }
        for (std::size_t t = 0; t < 2; ++t)
          for (std::size_t i = 0; i < mean[t].size(); ++i) ref[t][i] -= lr * float(mean[t][i]);
      }
      for (std::size_t t = 0; t < 2; ++t)
        for (std::size_t i = 0; i < ref[t].size(); ++i) {
          const double want = ref[t][i], got = s.parameters()[t][i];
          if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want)))
            fail("tensor " + std::to_string(t) + " element " + std::to_string(i) + ": PS " + std::to_string(got) +
                 ", all-reduce reference " + std::to_string(want));
        }
    }
  }
  // (A worker that stops after a few steps on purpose, finish_rank, has no loss to reach.)
  if (!options.checkpoint_dir.empty() || p.until_applied || spec.rank == p.finish_rank || after < 0.2 * before)
    std::printf("rank %d: PASS pushes=%llu loss %.4f -> %.4f lost_workers=%u failovers=%d params=%016llx\n", spec.rank,
                (unsigned long long)pushes, before, after, s.aggregation().lost_workers(), s.aggregation().failovers(),
                (unsigned long long)hash_of(s.parameters()));
  else
    fail("loss did not fall enough: " + std::to_string(before) + " -> " + std::to_string(after));
}

template <class F>
void expect_peer_lost(F&& f) {
  try {
    f();
  } catch (const gw::error& e) {
    if (e.kind() != gw::errc::peer_lost) throw;
    std::printf("rank %d: EXPECTED %s: %s\n", my_rank, gw::make_error_code(e.kind()).message().c_str(), e.what());
    return;
  }
  fail("expected a lost peer, but the run finished");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string arg = argc > 2 ? argv[2] : "";
  try {
    const auto spec = gw::cluster::detect();
    my_rank = spec.rank;
    gw::ps::options options;
    if (mode == "sync") {
      run<gw::ps::sync>(spec, options, {});
    } else if (mode == "async") {
      run<gw::ps::async>(spec, options, {.steps = 60, .slow_rank = 1, .slow_ms = 5},
                         [](const gw::ps::server_stats& st, int workers) {
                           if (st.dropped != 0 || st.applied != 60u * workers) fail("async dropped or lost gradients");
                         });
    } else if (mode == "bounded") {
      static int bound = std::stoi(arg);
      plan p{.steps = 40, .slow_rank = 1, .lag = true};
      auto check = [](const gw::ps::server_stats& st, int) {
        if (st.staleness.size() > static_cast<std::size_t>(bound) + 1 || st.max_lead > static_cast<std::uint64_t>(bound))
          fail("staleness above the bound " + std::to_string(bound));
        if (st.max_lead != static_cast<std::uint64_t>(bound))
          fail("no worker was answered with the lead of " + std::to_string(bound) + " it had");
      };
      if (bound == 1) run<gw::ps::bounded_staleness<1>>(spec, options, p, check);
      else if (bound == 3) run<gw::ps::bounded_staleness<3>>(spec, options, p, check);
      else fail("bounded: the test instantiates s = 1 and s = 3");
    } else if (mode == "backup") {
      run<gw::ps::backup_workers<1>>(spec, options,
                                     {.steps = 30, .slow_rank = 1, .lag = true, .pace_ms = 5, .until_applied = true},
                                     [](const gw::ps::server_stats& st, int workers) {
                                       if (st.applied != st.version * (workers - 1)) fail("a step closed with != N-1");
                                       if (st.dropped_by[1] == 0) fail("the slow worker's gradients were never late");
                                     });
    } else if (mode == "kill") {
      // The survivors train on until a server's reply reports the loss (the chief then logs
      // it), however long the transport takes to notice (UCX over shared memory: through
      // its keepalive, within about a second). Servers cannot finish without noticing: they
      // serve until every live worker is done.
      run<gw::ps::async>(spec, options,
                         {.steps = 60, .slow_rank = -1, .slow_ms = 0, .pace_ms = 5, .kill_rank = std::stoi(arg),
                          .until_loss_seen = true},
                         [](const gw::ps::server_stats& st, int) {
                           if (st.lost_workers.size() != 1) fail("expected exactly one lost worker");
                         });
    } else if (mode == "rejoin") {
      // Until the servers have applied a run's worth: the replacement takes part in the
      // rest of it. Only the first incarnation of worker K dies. Long enough (6 s) that a
      // replacement started on a loaded machine still finds the job running.
      const bool replacement = std::getenv("GRADWIRE_REJOIN") && std::string(std::getenv("GRADWIRE_REJOIN")) == "1";
      run<gw::ps::async>(spec, options,
                         {.steps = 240, .pace_ms = 25, .kill_rank = replacement ? -1 : std::stoi(arg), .kill_step = 10,
                          .until_applied = true},
                         [](const gw::ps::server_stats& st, int) {
                           if (st.lost_workers.size() != 1 || st.rejoined_workers != st.lost_workers)
                             fail("expected the killed worker lost once and taken back once");
                         });
#if !GRADWIRE_TEST_UCX && !GRADWIRE_TEST_MPI
    } else if (mode == "rejoin-mid-push") {
      // As `rejoin`, but no worker kills itself: the servers hold after worker K's 10th
      // gradient (held_tcp) until the test has killed it and their transports have seen it.
      static int victim = std::stoi(arg);
      run<gw::ps::async, held_tcp>(
          spec, options, {.steps = 240, .pace_ms = 25, .until_applied = true},
          [](const gw::ps::server_stats& st, int) {
            if (st.lost_workers.size() != 1 || st.rejoined_workers != st.lost_workers)
              fail("expected the killed worker lost once and taken back once");
          },
          +[] { return held_tcp(join_job(), is_replacement() ? -1 : victim, 10); });
#endif
    } else if (mode == "lose-worker" && argc > 3) {
      // The survivors would train on for long (100000 steps): only the loss ends them.
      const plan p{.steps = 100000, .pace_ms = 2, .kill_rank = std::stoi(argv[3])};
      if (arg == "sync") expect_peer_lost([&] { run<gw::ps::sync>(spec, options, p); });
      else if (arg == "backup") expect_peer_lost([&] { run<gw::ps::backup_workers<1>>(spec, options, p); });
      else fail("lose-worker: sync or backup");
    } else if (mode == "bounded-kill") {
      // A dead worker must not hold the gate: with it counted, the others would wait at
      // their pull until this timeout.
      ps_timeout = std::chrono::seconds(15);
      const int victim = std::stoi(arg);
      run<gw::ps::bounded_staleness<2>>(spec, options,
                                        {.steps = 40, .slow_rank = victim, .lag = true, .kill_rank = victim,
                                         .kill_step = 6, .kill_after_lag = true},
                                        [](const gw::ps::server_stats& st, int) {
                                          if (st.lost_workers.size() != 1) fail("expected exactly one lost worker");
                                        });
    } else if (mode == "sync-rejoin") {
      const plan p{.steps = 100000, .pace_ms = 2, .kill_rank = is_replacement() ? -1 : std::stoi(arg), .hold_rank = 0};
      expect_peer_lost([&] { run<gw::ps::sync>(spec, options, p); });
    } else if (mode == "finish-early") {
      run<gw::ps::async>(spec, options,
                         {.steps = 100000, .pace_ms = 10, .until_released = true, .finish_rank = std::stoi(arg)});
    } else if (mode == "servers-finish") {
      run<gw::ps::async>(spec, options,
                         {.steps = 30, .pace_ms = 10, .kill_rank = is_replacement() ? -1 : std::stoi(arg),
                          .hold_rank = 0});
    } else if (mode == "server-loss") {
      options.checkpoint_dir = arg;
      options.checkpoint_every = 5;
      if (spec.rank == spec.world_size - 1)  // the last server dies mid-run, once its checkpoints 5 and 10 are written:
        options.learning_rate = [](std::uint64_t version, std::uint64_t) {  // run just before each update
          if (version == 12) std::raise(SIGKILL);
          return double(lr);
        };
      if (argc > 3 && std::string(argv[3]) == "async")
        expect_peer_lost([&] { run<gw::ps::async>(spec, options, {.steps = 100000}); });
      else
        expect_peer_lost([&] { run<gw::ps::sync>(spec, options, {.steps = 100000}); });
    } else if (mode == "resume") {
      options.checkpoint_dir = arg;
      options.checkpoint_every = 5;
      run<gw::ps::sync>(spec, options, {.steps = 10});
    } else if (mode == "failover" && argc > 4) {
      options.standby = true;
      options.standby_lag = 4;
      const int victim = std::stoi(argv[3]);
      const std::string when = argv[4];
      if (spec.rank == victim && when.rfind("update:", 0) == 0) {
        // The servers' learning-rate schedule runs just before each update: the victim dies there.
        static std::uint64_t at = std::stoull(when.substr(7));
        options.learning_rate = [](std::uint64_t, std::uint64_t) {
          if (++calls == at) std::raise(SIGKILL);
          return double(lr);
        };
      } else if (spec.rank == victim && when.rfind("ms:", 0) == 0) {
        kill_after_ms = std::stoi(when.substr(3));
      }
      if (argc > 6) {
        const int servers = spec.count(gw::cluster::task_type::ps) / 2;
        options.checkpoint_dir = std::string(argv[6]) + (spec.rank >= spec.world_size - servers ? "/standby" : "");
      }
      const plan p{.steps = argc > 5 ? std::stoi(argv[5]) : 60, .pace_ms = 10};
#if !GRADWIRE_TEST_UCX && !GRADWIRE_TEST_MPI
      if (arg == "sync" && when == "request:1") {  // asio_tcp only: the victim dies in held_tcp
        static const bool dies = spec.rank == victim;
        static const int first_server = spec.world_size - spec.count(gw::cluster::task_type::ps);
        run<gw::ps::sync, held_tcp>(spec, options, p, nullptr,
                                    +[] { return held_tcp(join_job(), dies, first_server); });
        return 0;
      }
#endif
      if (arg == "sync") run<gw::ps::sync>(spec, options, p);
      else if (arg == "async") run<gw::ps::async>(spec, options, p);
      else fail("failover: sync or async");
    } else {
      std::fprintf(stderr, "usage: ps_worker sync|async|bounded S|backup|kill K|rejoin K|server-loss DIR [async]|"
                           "resume DIR|rejoin-mid-push K|"
                           "lose-worker sync|backup K|bounded-kill K|sync-rejoin K|finish-early K|servers-finish K|"
                           "failover sync|async VICTIM update:K|ms:D\n");
      return 2;
    }
  } catch (const gw::error& e) {  // the kind too, for the tests that expect one (errc=NAME)
    static constexpr const char* names[] = {"?",        "timeout", "peer_lost",        "mismatch", "protocol",
                                            "auth",     "config",  "invalid_argument", "device"};
    const auto k = static_cast<std::size_t>(e.kind());
    std::printf("rank %d: FAIL errc=%s: %s\n", my_rank, k < std::size(names) ? names[k] : "?", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    return 1;
  }
  return 0;
}
