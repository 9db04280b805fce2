// One rank of an elastic all-reduce job (aggregation::elastic_all_reduce), started by scripts/gradwire-run
// --keep-going over loopback TCP or UCX, for test_elastic.py.
//
//   elastic_worker shrink VICTIM STEP STEPS
//       Trains STEPS steps of least squares with SGD. Rank VICTIM (-1: none) raises SIGKILL at
//       the start of its step STEP, once every other rank has finished step STEP - 1 (each
//       rank writes $GW_TEST_SYNC_DIR/done-R-K after its step K): a loss at a chosen point.
//       Each survivor then checks its parameters against a float64 serial reference that
//       sums every rank's gradients before step STEP and the survivors' from it on, and prints
//         rank R: PASS view E members A,B,C lost V redone X hash H diff D
//   elastic_worker train STEPS PACE_MS
//       Trains STEPS steps of PACE_MS each, for a test that kills or stops ranks from outside
//       (each rank writes its pid to $GW_TEST_SYNC_DIR/pid-R at the start, and step10-R after
//       its step 10). When a step completes in a new view, a survivor prints
//         rank R: RECOVERED view E step K at NS
//       (NS: the steady clock, CLOCK_MONOTONIC, in ns: a harness on the same machine subtracts
//       the time it killed the rank). With one rank lost, the survivor then looks for the step
//       from which the float64 reference leaves that rank out and matches its parameters, and
//       prints the same PASS line with that reference's diff and " cut K" (K -1: none matched).
//
//   elastic_worker rejoin VICTIM STEP AFTER
//       As shrink, but scripts/gradwire-run --max-restarts starts the victim again
//       (GRADWIRE_REJOIN=1): the survivors step on (20 ms a step) until the replacement is
//       taken in after some step J - 1, then AFTER more steps; the replacement starts at J.
//       Each checks the float64 reference that leaves the victim out of steps STEP..J-1 and
//       prints the PASS line with cut J.
//   elastic_worker rejoin VICTIM STEP AFTER SECOND
//       As rejoin, and once VICTIM's replacement is in (from step J1), rank SECOND is lost at
//       step J1 + 2 and restarted too: its replacement must reach VICTIM's (which listens at the
//       address it published) to be taken in, from some step J2. The reference leaves each
//       victim out from its loss to its replacement's join; the PASS line has cut J2 (rank 0
//       writes J1 to $GW_TEST_SYNC_DIR/join-1 for SECOND's replacement).
//
//   elastic_worker abandon
//       The transport alone (3 ranks): the last rank posts a 64 MiB send to rank 1 and stops
//       itself (SIGSTOP) before it is through; rank 1, which tolerates that rank's loss (as the
//       elastic all-reduce does), gives up on the receive after 1 s and drops it. Over UCX on
//       TCP the rendezvous is then half done and UCX still holds the receive: the transport
//       must cut the stopped rank off, not fail. Rank 1 then kills it, ranks 0 and 1 exchange
//       a message, and each prints
//         rank R: PASS abandon received|abandoned lost L
//       (L: the peers rank 1 had lost right after the drop, "-" for none).
//
// A rank that fails prints "rank R: EXPECTED <errc>: <what>" for peer_lost (the test says
// whether that was expected) or "rank R: FAIL <what>", and exits 1.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gradwire/aggregation/elastic_all_reduce.hpp>
#include <gradwire/asio.hpp>
#if GRADWIRE_TEST_UCX
#include <gradwire/ucx.hpp>
#endif
#include <gradwire/gradwire.hpp>
#include <gradwire/support/fnv1a.hpp>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "helpers/least_squares.hpp"

namespace gw = gradwire;
using gw::testing::batch_data;
// Built twice: over Boost.Asio TCP (elastic_worker) and UCX (elastic_worker_ucx).
#if GRADWIRE_TEST_UCX
using transport_type = gw::transport::ucx;
transport_type join_job() { return gw::cluster::join_ucx(); }
#else
using transport_type = gw::transport::asio_tcp;
transport_type join_job() { return gw::cluster::join_tcp(); }
#endif
using strategy_type =
    gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::elastic_all_reduce, transport_type>;

namespace {

int my_rank = -1;
const gw::testing::least_squares model{16, 4, 8};
constexpr double learning_rate = 0.1;

// Rank w's batch at step k, the same wherever it is computed.
batch_data batch(int w, int k) {
  std::mt19937_64 gen(1000003ull * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(w) + 7);
  return model.random_batch(gen);
}

std::vector<double> start_values(std::size_t tensor) {
  std::vector<double> v(tensor == 0 ? model.outputs * model.inputs : model.outputs);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = tensor == 0 ? 0.1 * std::sin(double(i)) : 0.05 * double(i);
  return v;
}

std::filesystem::path sync_dir() {
  const char* d = std::getenv("GW_TEST_SYNC_DIR");
  if (d == nullptr || *d == '\0') throw std::runtime_error("GW_TEST_SYNC_DIR is not set");
  return d;
}

void mark_done(int rank, int step) { std::ofstream(sync_dir() / ("done-" + std::to_string(rank) + "-" + std::to_string(step))); }

// A bounded poll of the files the other ranks write after each step.
void await_others_done(int size, int victim, int step) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    while (!std::filesystem::exists(sync_dir() / ("done-" + std::to_string(r) + "-" + std::to_string(step)))) {
      if (std::chrono::steady_clock::now() > give_up) throw std::runtime_error("rank " + std::to_string(r) + " never finished step " + std::to_string(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

// The float64 serial reference: SGD on the mean of the gradients of `in(k)` ranks at step k.
template <class In>
std::vector<std::vector<double>> reference(int size, int steps, In in) {
  std::vector<std::vector<double>> p{start_values(0), start_values(1)};
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<double>> sum{std::vector<double>(p[0].size()), std::vector<double>(p[1].size())};
    int count = 0;
    for (int w = 0; w < size; ++w) {
      if (!in(w, k)) continue;
      ++count;
      const auto g = model.gradients<double>(p[0].data(), p[1].data(), batch(w, k));
      for (std::size_t t = 0; t < 2; ++t)
        for (std::size_t i = 0; i < sum[t].size(); ++i) sum[t][i] += g[t][i];
    }
    for (std::size_t t = 0; t < 2; ++t)
      for (std::size_t i = 0; i < p[t].size(); ++i) p[t][i] -= learning_rate * sum[t][i] / count;
  }
  return p;
}

std::uint64_t hash_of(std::span<const gw::host_tensor<float>> params) {
  gw::support::fnv1a h;
  for (const auto& t : params) h.add(std::as_bytes(std::span<const float>(t.data(), t.size())));
  return h.value();
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "-" : s;
}

// See "abandon" at the top.
int abandon(transport_type& t) {
  const int me = t.rank(), victim = t.size() - 1;
  if (t.size() != 3) throw std::runtime_error("abandon needs 3 ranks");
  if (me != victim) t.tolerate_loss(victim);
  const auto soon = [] { return gw::clock::now() + std::chrono::seconds(30); };
  std::vector<std::byte> big(std::size_t{64} << 20), word(8);
  if (me != 0) {  // the endpoints between 1 and the victim are up before the large message
    auto r = t.async_recv(3 - me, 1, word);
    auto s = t.async_send(3 - me, 1, word);
    t.wait(s, soon());
    t.wait(r, soon());
  }
  if (me == victim) {
    std::ofstream(sync_dir() / "pid-victim") << getpid() << std::flush;
    auto s = t.async_send(1, 2, big);
    transport_type::request* sending[] = {&s};
    try {  // a moment's progress puts some of it on the wire, not all: rank 1 reads at most ~0.1 GB in it
      t.wait_any(sending, gw::clock::now() + std::chrono::milliseconds(5));
    } catch (const gw::error& e) {
      if (e.kind() != gw::errc::timeout) throw;
    }
    std::raise(SIGSTOP);  // rank 1 kills it
    return 1;
  }
  std::string outcome = "-", lost_at_drop = "-";
  if (me == 1) {
    {
      auto r = t.async_recv(victim, 2, big);
      try {
        t.wait(r, gw::clock::now() + std::chrono::seconds(1));
        outcome = "received";  // shared memory: CMA reads a stopped process's memory
      } catch (const gw::error& e) {
        if (e.kind() != gw::errc::timeout && e.kind() != gw::errc::peer_lost) throw;
        outcome = "abandoned";
      }
    }  // dropped here (by the timeout), perhaps mid-message
    lost_at_drop = joined(t.lost_peers());
    long pid = 0;
    for (int i = 0; i < 1000 && pid <= 0; ++i) {  // written before it sent: there by now, but bounded
      std::ifstream(sync_dir() / "pid-victim") >> pid;
      if (pid <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid <= 0) throw std::runtime_error("no pid-victim file after 10 s");
    ::kill(static_cast<pid_t>(pid), SIGKILL);
  }
  std::uint64_t mine = 1000u + static_cast<std::uint64_t>(me), theirs = 0;
  auto r = t.async_recv(1 - me, 3, std::as_writable_bytes(std::span(&theirs, 1)));
  auto s = t.async_send(1 - me, 3, std::as_bytes(std::span(&mine, 1)));
  t.wait(s, soon());
  t.wait(r, soon());
  if (theirs != 1000u + static_cast<std::uint64_t>(1 - me))
    throw std::runtime_error("rank " + std::to_string(1 - me) + " sent " + std::to_string(theirs));
  std::printf("rank %d: PASS abandon %s lost %s\n", me, outcome.c_str(), lost_at_drop.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!((mode == "shrink" && argc == 5) || (mode == "rejoin" && (argc == 5 || argc == 6)) ||
        (mode == "train" && argc == 4) || (mode == "abandon" && argc == 2))) {
    std::fprintf(stderr, "usage: elastic_worker shrink VICTIM STEP STEPS | rejoin VICTIM STEP AFTER [SECOND] | "
                         "train STEPS PACE_MS | abandon\n");
    return 2;
  }
  try {
    transport_type t = join_job();
    my_rank = t.rank();
    if (mode == "abandon") return abandon(t);
    const bool replacement = gw::concepts::rejoined(t);
    const int size = t.size();
    std::vector<gw::host_tensor<float>> params;
    for (std::size_t tensor = 0; tensor < 2; ++tensor) {
      const auto v = start_values(tensor);
      params.emplace_back(gw::shape{v.size()});
      for (std::size_t i = 0; i < v.size(); ++i) params.back()[i] = my_rank == 0 ? float(v[i]) : 99.f;  // rank 0's win
    }
    strategy_type s(std::move(t), std::move(params), gw::optim::sgd({.lr = float(learning_rate)}));
    const bool scripted = mode == "shrink" || mode == "rejoin";
    const int victim = scripted ? std::stoi(argv[2]) : -1;
    const int lose_at = scripted ? std::stoi(argv[3]) : -1;
    int steps = mode == "rejoin" ? 0 : std::stoi(argv[mode == "shrink" ? 4 : 2]);
    const int after = mode == "rejoin" ? std::stoi(argv[4]) : 0;
    // rejoin: the victims (a second one lost two steps after the first is back), and the
    // step from which each one's replacement's gradients are in (J1, J2), as seen so far.
    std::vector<int> victims{victim};
    if (argc == 6) victims.push_back(std::stoi(argv[5]));
    std::vector<int> joins;
    std::size_t joins_seen = 0;  // of joined_ranks()
    const auto join_file = sync_dir() / "join-1";
    if (replacement) {
      const int at = static_cast<int>(s.aggregation().applying_step());
      if (my_rank != victim) {  // the second victim's: the first join's step, as rank 0 wrote it
        int first = -1;
        std::ifstream(join_file) >> first;
        if (first < 0) throw std::runtime_error("no join-1 file");
        joins.push_back(first);
      }
      joins.push_back(at);
      joins_seen = s.aggregation().joined_ranks().size();
      std::printf("rank %d: REJOINED at step %d\n", my_rank, at);
      std::fflush(stdout);
    }
    auto all_joined = [&] { return mode != "rejoin" || joins.size() == victims.size(); };
    if (mode == "rejoin" && all_joined()) steps = joins.back() + after;
    auto lost_at = [&](int w) {  // the step rank w is lost at, -1: never
      if (mode == "shrink" || (mode == "rejoin" && w == victim)) return w == victim ? lose_at : -1;
      if (victims.size() > 1 && w == victims[1] && !joins.empty()) return joins[0] + 2;
      return -1;
    };
    const int pace_ms = mode == "train" ? std::stoi(argv[3]) : 0;
    if (mode == "train") std::ofstream(sync_dir() / ("pid-" + std::to_string(my_rank))) << getpid() << std::flush;
    std::uint32_t epoch = replacement ? s.aggregation().view().epoch : 0;
    for (int k = replacement ? joins.back() : 0; !all_joined() ? k < 3000 : k < steps; ++k) {
      if (mode == "train" && k == 11) std::ofstream(sync_dir() / ("step10-" + std::to_string(my_rank)));
      if (scripted && k == lost_at(my_rank)) {
        if (k > 0) await_others_done(size, my_rank, k - 1);
        std::printf("rank %d: DYING at step %d\n", my_rank, k);
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));  // stands for compute
      const auto p = s.parameters();
      s.step(model.gradients<float>(p[0].data(), p[1].data(), batch(my_rank, k)));
      if (scripted) mark_done(my_rank, k);
      if (!all_joined()) {
        if (s.aggregation().joined_ranks().size() > joins_seen) {
          joins_seen = s.aggregation().joined_ranks().size();
          joins.push_back(static_cast<int>(s.aggregation().applying_step()));
          if (my_rank == 0 && joins.size() == 1) std::ofstream(join_file) << joins[0] << std::flush;
          if (all_joined()) steps = joins.back() + after;
        } else if (k >= lose_at) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a replacement asks meanwhile
        }
      }
      if (s.aggregation().view().epoch != epoch) {
        epoch = s.aggregation().view().epoch;
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch()).count();
        std::printf("rank %d: RECOVERED view %u step %d at %lld\n", my_rank, epoch, k, static_cast<long long>(ns));
        std::fflush(stdout);
      }
    }
    auto diff_from = [&](const std::vector<std::vector<double>>& want) {
      double d = 0;
      for (std::size_t tensor = 0; tensor < 2; ++tensor)
        for (std::size_t i = 0; i < want[tensor].size(); ++i)
          d = std::max(d, std::abs(double(s.parameters()[tensor][i]) - want[tensor][i]));
      return d;
    };
    double diff = -1;
    int cut = -1;
    if (!all_joined()) {
      std::printf("rank %d: FAIL %zu of %zu replacements were taken in within 3000 steps\n", my_rank, joins.size(),
                  victims.size());
      return 1;
    }
    if (scripted) {
      // Victim i is out from the step it was lost at to the step its replacement joined at.
      auto out = [&](int w, int k) {
        for (std::size_t i = 0; i < victims.size(); ++i)
          if (w == victims[i]) {
            const int from = i == 0 ? lose_at : joins[0] + 2;
            const int back = mode == "rejoin" ? joins[i] : steps;
            if (k >= from && k < back) return true;
          }
        return false;
      };
      cut = mode == "rejoin" ? joins.back() : -1;
      diff = diff_from(reference(size, steps, [&](int w, int k) { return !out(w, k); }));
      if (!(diff < 1e-5)) {
        std::printf("rank %d: FAIL parameters differ from the float64 reference by %g\n", my_rank, diff);
        return 1;
      }
    }
    const auto& agent = s.aggregation();
    if (mode == "train" && agent.lost_ranks().size() == 1) {
      const int lost = agent.lost_ranks()[0];
      for (int c = 0; c <= steps && cut < 0; ++c) {
        const double d = diff_from(reference(size, steps, [&](int w, int k) { return w != lost || k < c; }));
        if (d < 1e-5) {
          cut = c;
          diff = d;
        }
      }
    }
    std::printf("rank %d: PASS view %u members %s lost %s redone %llu hash %016llx diff %.3g cut %d\n", my_rank,
                agent.view().epoch, joined(agent.view().members).c_str(), joined(agent.lost_ranks()).c_str(),
                static_cast<unsigned long long>(agent.redone_steps()),
                static_cast<unsigned long long>(hash_of(s.parameters())), diff, cut);
    std::fflush(stdout);
  } catch (const gw::error& e) {
    if (e.kind() == gw::errc::peer_lost) {
      std::printf("rank %d: EXPECTED peer_lost: %s\n", my_rank, e.what());
      std::fflush(stdout);
      return 1;
    }
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    return 1;
  }
  return 0;
}
