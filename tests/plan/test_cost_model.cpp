// The analytic cost models (plan/cost_model.hpp) against closed forms derived by hand, and the planner's options and --simulate.
#include <catch2/catch.hpp>

#include <array>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gradwire/collective/verify.hpp>
#include <gradwire/plan/cost_model.hpp>
#include <gradwire/ps/protocol.hpp>

#include "plan_options.hpp"
#include "simulate.hpp"
#include "helpers/errors.hpp"

namespace gw = gradwire;
namespace plan = gradwire::plan;
using plan::all_reduce_algorithm;

namespace {

// Options without the call check's frames, for the pure closed forms; the frames are
// checked on their own below.
plan::cost_options unchecked() {
  plan::cost_options o;
  o.collective.verify = false;
  return o;
}

double predicted(const plan::cluster_model& c, all_reduce_algorithm a, std::size_t elements,
                 const plan::cost_options& o = unchecked()) {
  const auto cost = plan::predict_all_reduce(c, a, elements, o);
  REQUIRE(cost.available);
  return cost.seconds;
}

// One message alone, its receive included: overhead to send, latency, bytes / bandwidth,
// overhead to receive (transport/simulated/network.hpp, scheduler.hpp).
double hop(const plan::cluster_model& c, const plan::link_model& l, double bytes) {
  return 2 * plan::seconds_of(c.overhead) + plan::seconds_of(l.latency) + bytes / l.bandwidth;
}

}  // namespace

TEST_CASE("a round prices contention: k messages through one link cost k times their bytes") {
  // Sender r posts its k-th message at k overhead; each egress link, then each ingress
  // link, carries its messages one after another (transport/simulated/network.hpp); the receive
  // completes an overhead after the last byte.
  const auto c = plan::parse_cluster_model("hosts=3 bandwidth=1GB latency=10us overhead=1us");
  const double n = 1e6, o = 1e-6, a = 10e-6, b = 1e9;
  const std::vector<plan::message> one{{0, 1, n}};
  CHECK(plan::round_seconds(c, one) == Approx(o + a + n / b + o));
  // Two hosts into one: its ingress carries both.
  const std::vector<plan::message> into{{0, 2, n}, {1, 2, n}};
  CHECK(plan::round_seconds(c, into) == Approx(o + a + 2 * n / b + o));
  // One host out to two: its egress carries both (the second overhead is paid while the
  // first message is on the wire).
  const std::vector<plan::message> out{{0, 1, n}, {0, 2, n}};
  CHECK(plan::round_seconds(c, out) == Approx(o + 2 * n / b + a + o));
  // Opposite directions of one link do not share (full duplex).
  const std::vector<plan::message> both{{0, 1, n}, {1, 0, n}};
  CHECK(plan::round_seconds(c, both) == Approx(o + a + n / b + o));
  // Steady state: 500 messages/s of 1 MB through a 1 GB/s link is half of it.
  plan::link_loads rate(c);
  rate.add(one, 500);
  CHECK(rate.utilisation() == Approx(0.5));
}

TEST_CASE("a round's busy links carry into the next round, a local ingress beside a network ingress of one index") {
  // Ranks 0..2 on host 0, 3..5 on host 1. Round one sends into rank 1's local ingress
  // (link {2, 1}) and into host 1's network ingress (link {3, 1}): the same index, two
  // kinds, next to each other in the ingress order. Both links' free times must be kept
  // for the next round, which queues a message from rank 2 (whose egress is free) behind
  // the one still arriving at rank 1.
  const auto c = plan::parse_cluster_model(
      "hosts=2 ranks_per_host=3 bandwidth=1GB latency=10us local_bandwidth=10GB local_latency=2us overhead=1us");
  const double o = 1e-6, a = 10e-6, b = 1e9, la = 2e-6, lb = 10e9;
  const double nl = 1e7, n = 1e6;  // nl / lb = 1 ms, n / b = 1 ms
  plan::link_busy busy;
  const std::vector<plan::message> first{{0, 1, nl}, {0, 3, n}};
  const auto t1 = plan::round_times(c, first, {}, &busy);
  REQUIRE(t1.size() == 2);
  CHECK(t1[0].sent == Approx(o + nl / lb));
  CHECK(t1[0].arrived == Approx(o + la + nl / lb));
  CHECK(t1[1].sent == Approx(2 * o + n / b));
  CHECK(t1[1].arrived == Approx(2 * o + a + n / b));
  CHECK(busy[{2, 1}] == Approx(o + la + nl / lb));
  CHECK(busy[{3, 1}] == Approx(2 * o + a + n / b));
  // Round two: rank 2 posts at o on its own egress, reaches rank 1's ingress at o + la,
  // and waits there until round one's message has arrived.
  const std::vector<plan::message> second{{2, 1, nl}};
  const auto t2 = plan::round_times(c, second, {}, &busy);
  REQUIRE(t2.size() == 1);
  CHECK(t2[0].sent == Approx(o + nl / lb));
  CHECK(t2[0].arrived == Approx(o + la + 2 * nl / lb));
  // And a message into host 1 queues behind round one's network message.
  const std::vector<plan::message> third{{1, 4, n}};
  const auto t3 = plan::round_times(c, third, {}, &busy);
  REQUIRE(t3.size() == 1);
  CHECK(t3[0].arrived == Approx(2 * o + a + 2 * n / b));
}

TEST_CASE("ring all-reduce: 2(N-1) steps of one part, one network hop per host boundary") {
  // Step s: rank r sends part (r - s - 1) mod N, n/N elements, to r + 1 and waits for
  // part (r - s - 2) from r - 1; nothing else is on its links, so each step is one
  // message alone: 2 overhead + latency + (n/N) bytes / bandwidth; 2(N-1) steps in all.
  for (int ranks : {2, 3, 4, 7}) {
    CAPTURE(ranks);
    const std::size_t elements = 7 * 5 * 4 * 3 * 1024;  // divisible by every N here
    const double part = double(elements * sizeof(float)) / ranks;
    // One host: local ports only.
    const auto one_host = plan::parse_cluster_model("hosts=1 ranks_per_host=" + std::to_string(ranks) +
                                                   " local_bandwidth=10GB local_latency=2us overhead=500ns");
    CHECK(predicted(one_host, all_reduce_algorithm::ring, elements) ==
          Approx(2 * (ranks - 1) * hop(one_host, one_host.local, part)));
    // One rank per host: every hop crosses the network.
    const auto spread = plan::parse_cluster_model("hosts=" + std::to_string(ranks) + " bandwidth=1Gbit latency=50us");
    CHECK(predicted(spread, all_reduce_algorithm::ring, elements) ==
          Approx(2 * (ranks - 1) * hop(spread, spread.network, part)));
    CHECK(plan::predict_all_reduce(spread, all_reduce_algorithm::ring, elements).rounds == 2 * (ranks - 1));
  }
  // Hosts of several ranks: steps are not in lockstep. Each rank waits only for its left
  // neighbour, so the ranks behind a host's local hops run ahead, and what binds is the
  // host's last rank sending one part per step across, back to back: its send of step s
  // leaves part / bandwidth after its send of step s - 1 (the parts from its left arrive
  // over the fast local hops in time). 2(N-1) - 1 parts one after another on the host
  // link, then the last one's hop: (2(N-1) - 1) part / bandwidth + latency + part /
  // bandwidth. (Lockstep would charge every step the network hop: 2(N-1) x 82 us here,
  // against 370 us; the simulator measures 370.)
  const auto mixed = plan::parse_cluster_model("hosts=2 ranks_per_host=3 bandwidth=1Gbit latency=50us");
  const std::size_t elements = 6 * 1000;
  const double part = elements * 4.0 / 6;
  CHECK(predicted(mixed, all_reduce_algorithm::ring, elements) ==
        Approx(9 * part / mixed.network.bandwidth + hop(mixed, mixed.network, part)));
  // Parts are cut in elements: 10 elements on 3 ranks are priced at the longest, 4.
  const auto three = plan::parse_cluster_model("hosts=3 bandwidth=1GB latency=0s");
  CHECK(predicted(three, all_reduce_algorithm::ring, 10) == Approx(4 * 16 / 1e9));
}

TEST_CASE("the call check's frames ride in the first round") {
  // With verify on, a rank posts a check_frame to each neighbour before step 0's data:
  // the data leaves at 3 overheads (the frames, 88 B, are off the port by then), so step
  // 0 takes 3 overhead + latency + part / bandwidth + overhead.
  const auto c = plan::parse_cluster_model("hosts=1 ranks_per_host=4 local_bandwidth=1GB local_latency=1us overhead=1us");
  const std::size_t elements = 4096;
  const double part = elements * 4.0 / 4, frame = sizeof(gw::collective::check_frame);
  const double first = 3e-6 + 1e-6 + part / 1e9 + 1e-6;
  const double rest = 5 * hop(c, c.local, part);
  CHECK(plan::predict_all_reduce(c, all_reduce_algorithm::ring, elements).seconds == Approx(first + rest));
  // Nothing to reduce: the frames alone; the left-going frame, posted second, is last.
  CHECK(plan::predict_all_reduce(c, all_reduce_algorithm::ring, 0).rounds == 1);
  CHECK(plan::predict_all_reduce(c, all_reduce_algorithm::ring, 0).seconds == Approx(2e-6 + 1e-6 + frame / 1e9 + 1e-6));
}

TEST_CASE("halving-doubling: 2 log2 P exchanges, a fold and an unfold for N not a power of two") {
  const auto c = plan::parse_cluster_model("hosts=1 ranks_per_host=4 local_bandwidth=1GB local_latency=2us");
  const std::size_t elements = 1 << 16;
  const double n = elements * 4.0;
  // Halving gives away n/2 then n/4; doubling sends n/4 then n/2; one message per rank each.
  const double four = hop(c, c.local, n / 2) + hop(c, c.local, n / 4) + hop(c, c.local, n / 4) + hop(c, c.local, n / 2);
  CHECK(predicted(c, all_reduce_algorithm::halving_doubling, elements) == Approx(four));
  // Five ranks: rank 0 folds its whole buffer into rank 1 first and gets the result back
  // last. Rank 1 is on the whole path (the others' early messages to it queue behind the
  // fold on its port): the four exchanges plus two whole-buffer hops.
  const auto five = plan::parse_cluster_model("hosts=1 ranks_per_host=5 local_bandwidth=1GB local_latency=2us");
  CHECK(predicted(five, all_reduce_algorithm::halving_doubling, elements) == Approx(four + 2 * hop(five, five.local, n)));
  CHECK(plan::predict_all_reduce(five, all_reduce_algorithm::halving_doubling, elements).rounds == 6);
}

TEST_CASE("halving-doubling contends on host links where the ring does not") {
  // 2 hosts x 2 ranks: the first halving exchange pairs rank r with r ^ 2, on the other
  // host; both ranks of a host send n/2 at once, so the host link carries n. The ring's
  // network step carries one part (n/4) per host, back to back over its 6 steps (see
  // above): 6 parts and one latency.
  const auto c = plan::parse_cluster_model("hosts=2 ranks_per_host=2 bandwidth=1GB latency=10us local_bandwidth=100GB "
                                          "local_latency=0s");
  const std::size_t elements = 1 << 18;
  const double n = elements * 4.0;
  const double across = 2 * hop(c, c.network, 2 * (n / 2));  // halving and doubling at distance 2
  const double inside = 2 * hop(c, c.local, n / 4);            // at distance 1, on the host
  CHECK(predicted(c, all_reduce_algorithm::halving_doubling, elements) == Approx(across + inside));
  CHECK(predicted(c, all_reduce_algorithm::ring, elements) == Approx(5 * (n / 4) / 1e9 + hop(c, c.network, n / 4)));
}

TEST_CASE("hierarchical: host ring, R parallel rings across hosts sharing the link, host ring") {
  // H = 2 hosts of R = 2: reduce-scatter in the host (1 round of a column, n/2, local),
  // 2(H-1) = 2 rounds across in which both ranks of a host send their column's 1/H (n/4),
  // then the all-gather in the host (1 round). The two rings across do not wait for each
  // other, so the host link stays busy while either's latency passes: the rounds across
  // take max(2 (latency + n/4 / bandwidth), latency + 2 rounds x 2 rings x n/4 / bandwidth).
  const auto c = plan::parse_cluster_model("hosts=2 ranks_per_host=2 bandwidth=1GB latency=10us local_bandwidth=10GB "
                                          "local_latency=1us");
  const std::size_t elements = 1 << 16;
  const double n = elements * 4.0;
  const double across = std::max(2 * hop(c, c.network, n / 4), 10e-6 + 2 * 2 * (n / 4) / 1e9);
  CHECK(across == Approx(10e-6 + n / 1e9));  // the link binds here
  CHECK(predicted(c, all_reduce_algorithm::hierarchical, elements) == Approx(2 * hop(c, c.local, n / 2) + across));
  // From 4 MiB on the library cuts K segments, staggered one round apart:
  // K - 1 + 2(R-1) + 2(H-1) rounds.
  const std::size_t big = std::size_t{8} << 20;
  const int k = plan::hierarchical_segment_count(c, big);
  CHECK(k > 1);
  CHECK(plan::predict_all_reduce(c, all_reduce_algorithm::hierarchical, big, unchecked()).rounds == k - 1 + 2 + 2);
  // Pipelining hides the local rounds behind the network ones: faster than one segment's sum.
  const double whole = big * 4.0;
  CHECK(predicted(c, all_reduce_algorithm::hierarchical, big) <
        2 * hop(c, c.local, whole / 2) + 2 * hop(c, c.network, whole / 2));
  // No hierarchy: the flat ring runs.
  const auto flat = plan::parse_cluster_model("hosts=4 bandwidth=1GB latency=10us");
  const auto cost = plan::predict_all_reduce(flat, all_reduce_algorithm::hierarchical, elements);
  CHECK(cost.runs == all_reduce_algorithm::ring);
  CHECK(cost.seconds == plan::predict_all_reduce(flat, all_reduce_algorithm::ring, elements).seconds);
}

TEST_CASE("one-shot: one round of N-1 copies per rank, and refused beyond 8 ranks") {
  const auto c = plan::parse_cluster_model("hosts=1 ranks_per_host=4 local_bandwidth=1GB local_latency=2us overhead=1us");
  const std::size_t elements = 1000;
  const double n = elements * 4.0;
  // Each rank sends 3 copies through its local egress port, to ranks in rank order, so
  // rank 3 gets every copy third: each leaves its sender at overhead + 2n / bandwidth, and
  // rank 3's port then takes the three one after another: overhead + 2n/bw + latency +
  // 3n/bw, and its receive's overhead (the simulator measures 24 us).
  CHECK(predicted(c, all_reduce_algorithm::one_shot, elements) == Approx(1e-6 + 2 * n / 1e9 + 2e-6 + 3 * n / 1e9 + 1e-6));
  const auto nine = plan::parse_cluster_model("hosts=1 ranks_per_host=9");
  const auto refused = plan::predict_all_reduce(nine, all_reduce_algorithm::one_shot, elements);
  CHECK_FALSE(refused.available);
  CHECK(refused.note.find("at most 8 ranks") != std::string::npos);
}

TEST_CASE("auto_ takes what all_reduce<auto_> takes, by size and topology") {
  const auto one_host = plan::parse_cluster_model("hosts=1 ranks_per_host=4");
  CHECK(plan::auto_choice(one_host, 1000) == all_reduce_algorithm::one_shot);  // 3 x 4000 B <= 64 KiB
  CHECK(plan::auto_choice(one_host, 8000) == all_reduce_algorithm::halving_doubling);
  CHECK(plan::auto_choice(one_host, 1 << 20) == all_reduce_algorithm::ring);
  const auto two_by_two = plan::parse_cluster_model("hosts=2 ranks_per_host=2");
  CHECK(plan::auto_choice(two_by_two, 16) == all_reduce_algorithm::one_shot);  // 64 B: inside the check frame
  CHECK(plan::auto_choice(two_by_two, 1000) == all_reduce_algorithm::halving_doubling);
  CHECK(plan::auto_choice(two_by_two, 1 << 16) == all_reduce_algorithm::hierarchical);
  const auto sixteen = plan::parse_cluster_model("hosts=16");
  CHECK(plan::auto_choice(sixteen, 1 << 16) == all_reduce_algorithm::ring);
  const auto picked = plan::predict_all_reduce(two_by_two, all_reduce_algorithm::auto_, 1 << 16);
  CHECK(picked.runs == all_reduce_algorithm::hierarchical);
  CHECK(picked.seconds == plan::predict_all_reduce(two_by_two, all_reduce_algorithm::hierarchical, 1 << 16).seconds);
}

TEST_CASE("straggler order statistics are deterministic, ordered, and exact without randomness") {
  const auto c = plan::parse_cluster_model("hosts=16 jitter=0.2 tail=0.05:1.5 seed=3");
  const plan::compute_statistics a(c, 16, 1e-3), b(c, 16, 1e-3);
  CHECK(a.expected_max() == b.expected_max());  // the same draws, bit for bit
  CHECK(a.expected_order_statistic(12) == b.expected_order_statistic(12));
  // Trial by trial the slowest is no faster than the 12th or the 1st: so are the means.
  CHECK(a.expected_max() >= a.expected_order_statistic(12));
  CHECK(a.expected_order_statistic(12) >= a.expected_order_statistic(1));
  CHECK(a.expected_max() > 1e-3);  // the tail makes the slowest of 16 slower than the median worker
  // A window of one step is the single step; longer windows average the stragglers out
  // (max of means <= mean of maxes: a margin for Monte Carlo noise only).
  CHECK(a.expected_max_mean(1) == a.expected_max());
  CHECK(a.expected_max_mean(8) < a.expected_max() * 1.02);
  // Another seed: other draws, close estimates.
  const auto other = plan::parse_cluster_model("hosts=16 jitter=0.2 tail=0.05:1.5 seed=4");
  CHECK(plan::compute_statistics(other, 16, 1e-3).expected_max() != a.expected_max());
  CHECK(plan::compute_statistics(other, 16, 1e-3).expected_max() == Approx(a.expected_max()).epsilon(0.1));
  // No randomness: fixed factors, exact.
  const auto fixed = plan::parse_cluster_model("hosts=4 speed=2 slow=1:3");
  const plan::compute_statistics f(fixed, 4, 1e-3);
  CHECK(f.expected_max() == Approx(6e-3));
  CHECK(f.expected_order_statistic(3) == Approx(2e-3));
  CHECK(f.expected(1, f.mean_draw()) == Approx(6e-3));
  // Nonsense refused, saying what is allowed.
  const auto [kind, what] = gw::testing::error_of([&] { (void)f.expected_order_statistic(5); });
  CHECK(kind == gw::errc::invalid_argument);
  CHECK(what.find("expected 1..4") != std::string::npos);
}

TEST_CASE("strategies: sync all-reduce, parameter servers, local SGD and central storage by hand") {
  // 2 workers on 2 hosts, no stragglers: compute is c, exactly.
  const auto c = plan::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us overhead=1us");
  const std::size_t p = 250'000;
  const double n = p * 4.0, step = 2e-3, o = 1e-6, a = 10e-6, bw = 1e9;
  const plan::strategy_costs costs(c, {p, {}, 32, step, {}}, unchecked());

  const auto ring = costs.all_reduce(all_reduce_algorithm::ring);
  CHECK(ring.compute == Approx(step));
  CHECK(ring.communication == Approx(2 * (2 * o + a + n / 2 / bw)));
  CHECK(ring.samples_per_second == Approx(2 * 32 / ring.step));
  // Bucketed (the gradient in 250 kB buckets): one all-reduce per bucket, one after another.
  REQUIRE(costs.buckets(250'000) == std::vector<std::size_t>(4, p / 4));
  const auto bucketed = costs.all_reduce(all_reduce_algorithm::ring, 250'000);
  CHECK(bucketed.communication == Approx(4 * 2 * (2 * o + a + n / 4 / 2 / bw)));
  CHECK_THAT(bucketed.note, Catch::Matchers::Contains("4 buckets"));

  // One server, rank 2 on a host of its own. At the close it posts the replies
  // ([40 B header][n]) to worker 0 then worker 1 (at 1 and 2 overheads), one after another
  // on its link: worker 1 has its reply at overhead + 2 (n + 40) / bw + latency, and its
  // receive completes an overhead later. It computes, then posts a request header, the
  // gradient and its pull request (3 overheads; the request leaves behind the gradient);
  // the server has them latency + (n + 32) / bw after the gradient left, and closes an
  // overhead later. Worker 0's push went through the server's ingress while worker 1
  // still waited for its reply: period = c + 5 overhead + 2 latency + 2 (n + 40) / bw +
  // (n + 32) / bw, not c + a push phase + a pull phase.
  const double header = sizeof(gw::ps::detail::request_header), reply = sizeof(gw::ps::detail::reply_header);
  const auto ps = costs.ps_sync(1);
  CHECK(ps.communication == Approx(5 * o + 2 * a + 2 * (n + reply) / bw + (n + header) / bw));
  CHECK(ps.note.find("1 server on host 2") != std::string::npos);
  CHECK(plan::with_servers(c, 1).hosts == 3);

  // Backup workers: a step waits for the first W - 1 and counts only their samples.
  const auto backup = costs.ps_backup_workers(1, 1);
  CHECK(backup.compute == Approx(step));
  CHECK(backup.samples_per_second == Approx(32 / backup.step));

  // Async: each worker steps every compute + its own push and pull alone; 4 workers of
  // 0.5 ms would send more than the server's link takes: each gradient puts n + 64 bytes
  // on its ingress, so at most bw / (n + 64) gradients per second.
  {
    const auto four = plan::parse_cluster_model("hosts=4 bandwidth=1GB latency=10us overhead=1us");
    const plan::strategy_costs fast(four, {p, {}, 32, 0.5e-3, {}}, unchecked());
    // Alone, the push (header, gradient, request: the request leaves behind the gradient)
    // takes 3 overhead + latency + (n + 32) / bw, the reply 2 overhead + latency + (n + 40) / bw.
    const double alone = 0.5e-3 + (3 * o + a + (n + header) / bw) + (o + a + (n + reply) / bw + o);
    const double wanted = 4 / alone, cap = bw / (n + 2 * header);
    REQUIRE(wanted > cap);
    const auto async = fast.ps_async(1);
    CHECK(async.samples_per_second == Approx(32 * cap));
    CHECK(async.step == Approx(4 / cap));
    CHECK_FALSE(async.synchronous);
    // The note says by how much the workers overask the busiest link: wanted / cap, in percent.
    const std::string capped = "capped by the busiest link or server (" +
                               std::to_string(static_cast<int>(std::lround(100 * wanted / cap))) + "% demanded)";
    CHECK_THAT(async.note, Catch::Matchers::Contains(capped));
    // Two workers ask for less than the link takes: each at its own round trip.
    const auto uncapped = costs.ps_async(1);
    const double two = 2e-3 + (3 * o + a + (n + header) / bw) + (o + a + (n + reply) / bw + o);
    CHECK(uncapped.samples_per_second == Approx(32 * 2 / two));
    CHECK(uncapped.note.find("capped") == std::string::npos);
  }

  // Local SGD: the parameter all-reduce once per H steps.
  const auto local = costs.local_sgd(4);
  const auto auto_ar = plan::predict_all_reduce(c, all_reduce_algorithm::auto_, p, unchecked());
  CHECK(local.communication == Approx(auto_ar.seconds / 4));
  CHECK(local.compute == Approx(step));
  CHECK_FALSE(local.synchronous);
  CHECK(costs.local_sgd(1).synchronous);
  // A period below 1 step means nothing (it would divide by zero): refused, as averaging<> does.
  for (const int bad : {0, -1}) {
    CAPTURE(bad);
    const auto [kind, what] = gw::testing::error_of([&] { (void)costs.local_sgd(bad); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Matchers::Contains("local SGD: the period must be >= 1 step, got " + std::to_string(bad)));
  }

  // Central storage: on 2 ranks the tree reduce is one message, the broadcast one message.
  const auto central = costs.central_storage();
  CHECK(central.communication == Approx(2 * (2 * o + a + n / bw)));

  // Stragglers slow every synchronous step, not the asynchronous workers' own pace.
  const auto slow = plan::parse_cluster_model("hosts=2 bandwidth=100GB latency=0s slow=1:3");
  const plan::strategy_costs slowed(slow, {p, {}, 32, step, {}}, unchecked());
  CHECK(slowed.all_reduce(all_reduce_algorithm::ring).compute == Approx(3 * step));
  CHECK(slowed.ps_async(1).compute == Approx(2 * step));  // the mean of 1 and 3
}

TEST_CASE("ZeRO-1, compressed all-reduce and DiLoCo by hand: the ring's phases, each codec's bytes, H and fragments") {
  // 2 workers on 2 hosts, no stragglers, no call-check frames: a ring step of b bytes costs
  // 2 overheads + latency + b / bandwidth.
  const auto c = plan::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us overhead=1us");
  const std::size_t p = 250'000;
  const double n = p * 4.0, step = 2e-3, o = 1e-6, a = 10e-6, bw = 1e9;
  const plan::strategy_costs costs(c, {p, {}, 32, step, {}}, unchecked());
  auto ring_step = [&](double bytes) { return 2 * o + a + bytes / bw; };

  const auto ring = costs.all_reduce(all_reduce_algorithm::ring);
  CHECK(ring.bytes_per_step == Approx(n));  // 2 (N - 1) / N of the model
  // ZeRO-1: a reduce-scatter step and an all-gather step, the ring's bytes and time.
  const auto zero = costs.sharded();
  CHECK(zero.communication == Approx(2 * ring_step(n / 2)));
  CHECK(zero.communication == Approx(ring.communication));
  CHECK(zero.bytes_per_step == Approx(n));
  CHECK(zero.synchronous);
  CHECK_THAT(zero.note, Catch::Matchers::Contains("optimizer state 1/2 per rank"));

  // Ring codecs: the same two steps of encoded chunks, plus their compute on the step.
  const auto fp16 = costs.compressed_all_reduce(plan::parse_codec("fp16"));
  CHECK(fp16.communication == Approx(2 * ring_step(n / 4)));
  CHECK(fp16.bytes_per_step == Approx(n / 2));
  CHECK(fp16.compute == Approx(step + plan::fp16_seconds_per_element * p));
  CHECK_FALSE(fp16.synchronous);  // a compressed image of the mean: progress per sample is the codec's
  const auto int8 = costs.compressed_all_reduce(plan::parse_codec("int8"));
  CHECK(int8.communication == Approx(2 * ring_step(n / 8)));
  CHECK(int8.bytes_per_step == Approx(n / 4));
  CHECK_THAT(int8.note, Catch::Matchers::Contains("4.0x fewer bytes"));
  // Top-k: one all-gather step of the 1% kept, 8 bytes (index, value) each.
  const auto topk = costs.compressed_all_reduce(plan::parse_codec("topk:0.01"));
  CHECK(topk.communication == Approx(ring_step(2500 * 8.0)));
  CHECK(topk.bytes_per_step == Approx(2500 * 8.0));
  // PowerSGD rank 4: 250000 elements are a 500 x 500 matrix; P and Q each 500 x 4 floats.
  const auto power = costs.compressed_all_reduce(plan::parse_codec("powersgd:4"));
  CHECK(power.communication == Approx(2 * predicted(c, all_reduce_algorithm::auto_, 2000)));
  CHECK(power.bytes_per_step == Approx(2 * 2000 * 4.0));
  CHECK(power.compute == Approx(step + plan::low_rank_seconds_per_element * 4 * p));
  // No codec: the plain ring.
  CHECK(costs.compressed_all_reduce(plan::parse_codec("none")).communication == Approx(ring.communication));
  // With the tensors' shapes, PowerSGD's plan under strategy<>: the 400 x 500 weight and the
  // 40 x 50 one are matrices of their own (P 1600 + 160, Q 2000 + 200), the 500-element bias
  // goes plain in P's round, and the codec's compute covers the matrices alone.
  const std::size_t shaped_p = 400 * 500 + 500 + 40 * 50;
  const plan::strategy_costs shaped(c,
                                    {shaped_p, {400 * 500, 500, 40 * 50}, 32, step,
                                     {gw::shape{400, 500}, gw::shape{500}, gw::shape{40, 50}}},
                                    unchecked());
  const auto by_tensor = shaped.compressed_all_reduce(plan::parse_codec("powersgd:4"));
  CHECK(by_tensor.communication == Approx(predicted(c, all_reduce_algorithm::auto_, 1600 + 160 + 500) +
                                          predicted(c, all_reduce_algorithm::auto_, 2000 + 200)));
  CHECK(by_tensor.bytes_per_step == Approx((1600 + 160 + 500 + 2000 + 200) * 4.0));
  CHECK(by_tensor.compute == Approx(step + plan::low_rank_seconds_per_element * 4 * (400 * 500 + 40 * 50)));
  {  // shapes that are not the tensors' are refused
    const auto [kind, what] = gw::testing::error_of([&] {
      (void)plan::strategy_costs(c, {shaped_p, {400 * 500, 500, 40 * 50}, 32, step, {gw::shape{400, 500}}},
                                 unchecked());
    });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Matchers::Contains("one per tensor"));
  }

  // DiLoCo: local SGD's all-reduce every H steps; streamed, each fragment's all-reduce
  // hides behind `delay` steps of compute.
  const auto diloco = costs.diloco(4);
  CHECK(diloco.communication == Approx(costs.local_sgd(4).communication));
  CHECK(diloco.bytes_per_step == Approx(n / 4));
  const auto streamed = costs.diloco(4, 2, 0);
  CHECK(streamed.communication == Approx(2 * predicted(c, all_reduce_algorithm::auto_, p / 2) / 4));
  const double one_fragment = predicted(c, all_reduce_algorithm::auto_, p / 2);
  const int hides = static_cast<int>(std::ceil(one_fragment / step));
  CHECK(costs.diloco(4, 2, hides).communication == 0);
  CHECK(costs.diloco(4, 2, 1).communication == Approx(2 * std::max(0.0, one_fragment - step) / 4));
  for (auto bad : {std::array{0, 1, 0}, std::array{4, 0, 0}, std::array{4, 1, -1}}) {
    const auto [kind, what] = gw::testing::error_of([&] { (void)costs.diloco(bad[0], bad[1], bad[2]); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Matchers::Contains("DiLoCo"));
  }
}

TEST_CASE("plan's codecs (--compress): each spelling parsed, anything else refused naming the choices") {
  CHECK(plan::parse_codec("bf16").bytes_per_element == 2);
  CHECK(plan::parse_codec("int8").bytes_per_element == 1);
  CHECK(plan::parse_codec("topk:0.25").fraction == 0.25);
  CHECK(plan::parse_codec("powersgd:2").rank == 2);
  CHECK_FALSE(plan::parse_codec("none").compresses());
  for (const char* bad : {"zstd", "topk", "topk:0", "topk:1.5", "topk:x", "powersgd:0", "powersgd:2x", "fp16:2"}) {
    CAPTURE(bad);
    const auto [kind, what] = gw::testing::error_of([&] { (void)plan::parse_codec(bad); });
    CHECK(kind == gw::errc::invalid_argument);
    CHECK_THAT(what, Catch::Matchers::Contains("powersgd:RANK"));
  }
  // PowerSGD's near-square matrix, which the planner takes from the codec (one rule):
  // cols = ceil(sqrt n), rows = ceil(n / cols).
  using gw::compress::low_rank::matrix_shape;
  CHECK(matrix_shape::of(10, 1).rows == 3);
  CHECK(matrix_shape::of(10, 1).cols == 4);
  CHECK(matrix_shape::of(250'000, 1).rows == 500);
  CHECK(matrix_shape::of(1, 1).cols == 1);
}

TEST_CASE("all-reduce with backup workers: the (W-k)-th compute, a round of one-byte messages, W-k gradients") {
  // 2 workers, no stragglers: a step waits for the first of them (c, exactly), adds one
  // round in which each rank sends one byte to the other (an overhead to send, the latency,
  // 1 byte on the link, an overhead after the arrival) to the ring's all-reduce, and counts
  // one worker's samples.
  const auto c = plan::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us overhead=1us");
  const std::size_t p = 250'000;
  const double step = 2e-3, o = 1e-6, a = 10e-6, bw = 1e9;
  const plan::strategy_costs costs(c, {p, {}, 32, step, {}}, unchecked());
  const auto ring = costs.all_reduce(all_reduce_algorithm::ring);
  const auto backup = costs.all_reduce_backup_workers(all_reduce_algorithm::ring, 1);
  CHECK(backup.compute == Approx(step));
  CHECK(backup.communication == Approx(ring.communication + (2 * o + a + 1 / bw)));
  CHECK(backup.samples_per_second == Approx(32 / backup.step));
  CHECK(backup.kind == plan::strategy_kind::all_reduce_backup_workers);
  CHECK_THAT(backup.note, Catch::Matchers::Contains("1 of 2 gradients dropped per step"));
  for (int k : {0, 2})
    CHECK_THROWS_WITH(costs.all_reduce_backup_workers(all_reduce_algorithm::ring, k),
                      Catch::Matchers::Contains("all-reduce backup workers: expected 1..1"));
  // Without stragglers dropping a gradient only loses samples: no backups is best.
  CHECK(costs.best_all_reduce_backups() == 0);

  // With a heavy tail (a tenth of the steps 10x slow) on 20 workers, a step of plain
  // all-reduce waits for the slowest of 20 draws (almost always one slow); dropping the
  // slowest few gains more time than samples, and the compute is that order statistic.
  const auto tail = plan::parse_cluster_model("hosts=20 bandwidth=10Gbit latency=10us tail=0.1:1.5:10 seed=5");
  const plan::strategy_costs slow(tail, {p, {}, 32, step, {}});
  const int best = slow.best_all_reduce_backups();
  CHECK(best >= 1);
  CHECK(best <= 10);
  const auto chosen = slow.all_reduce_backup_workers(all_reduce_algorithm::auto_, best);
  CHECK(chosen.compute == Approx(slow.statistics().expected_order_statistic(20 - best)));
  CHECK(chosen.samples_per_second > slow.all_reduce(all_reduce_algorithm::auto_).samples_per_second);
  for (int k = 1; k <= 10; ++k)
    CHECK(slow.all_reduce_backup_workers(all_reduce_algorithm::auto_, k).samples_per_second <=
          chosen.samples_per_second);
}

TEST_CASE("a parameter server holding nothing of the model costs the step nothing") {
  // One tensor of 50,000 floats (200 kB) is under the 256 KiB split: one piece, on server 0, so a second
  // server holds nothing (as the library's sharding leaves it) and no worker sends it
  // anything: the step costs what it costs with one server.
  const auto c = plan::parse_cluster_model("hosts=2 bandwidth=1GB latency=10us overhead=1us");
  const std::size_t p = 50'000;
  const plan::strategy_costs costs(c, {p, {p}, 32, 2e-3, {}}, unchecked());
  REQUIRE(costs.shards(2) == std::vector<std::size_t>{p, 0});
  const auto one = costs.ps_sync(1), two = costs.ps_sync(2);
  // The same arithmetic either way: equal to rounding (three empty messages per worker
  // would add their overheads, 6e-5 of the step).
  CHECK(two.communication == Approx(one.communication).epsilon(1e-9));
  CHECK(two.samples_per_second == Approx(one.samples_per_second).epsilon(1e-9));
  CHECK(costs.ps_async(2).samples_per_second == Approx(costs.ps_async(1).samples_per_second).epsilon(1e-9));
}

TEST_CASE("shards and buckets follow the library's sharding and bucket plans") {
  const auto c = plan::parse_cluster_model("hosts=4");
  const plan::strategy_costs flat(c, {1000, {}, 8, 1e-3, {}});
  CHECK(flat.shards(3) == std::vector<std::size_t>{333, 333, 334});
  CHECK(flat.buckets(1000) == std::vector<std::size_t>{250, 250, 250, 250});
  // Fashion-MNIST's MLP: the 784x256 weights split over 4 servers (256 KiB pieces), the rest whole.
  const plan::strategy_costs mlp(c, {235146, planner::fashion_mnist_tensors, 8, 1e-3, planner::fashion_mnist_shapes});
  std::size_t total = 0;
  for (auto s : mlp.shards(4)) total += s;
  CHECK(total == 235146);
  // By hand from the documented rule (docs/strategies/parameter_server.md): the default
  // split_bytes, 256 KiB, is 65,536 floats; only the 200,704 weights are larger, cut into
  // 4 pieces of 50,176; then largest first to the least loaded: 32,768 and 1,280, 256,
  // 128 and 10 on servers 0, 1, 2 and 3 (twice).
  CHECK(mlp.shards(4) == std::vector<std::size_t>{50176 + 32768, 50176 + 1280, 50176 + 256, 50176 + 128 + 10});
  // Ten servers: the weights still go in 4 pieces (none under 256 KiB would be cut), so
  // they reach only 4 servers (docs/planning.md), and the last server holds nothing.
  CHECK(mlp.shards(10) == std::vector<std::size_t>{50176, 50176, 50176, 50176, 32768, 1280, 256, 128, 10, 0});
  CHECK(mlp.buckets() == std::vector<std::size_t>{235146});
  const auto [kind, what] = gw::testing::error_of([&] { plan::strategy_costs bad(c, {10, {4, 5}, 8, 1e-3, {}}); });
  CHECK(kind == gw::errc::invalid_argument);
  CHECK(what.find("add up to 9") != std::string::npos);
}

TEST_CASE("recommend: the most samples per second, and what an asynchronous choice trades") {
  std::vector<plan::strategy_cost> costs(3);
  costs[0] = {"all_reduce<ring>", plan::strategy_kind::all_reduce, true, true, 1e-3, 1e-3, 2e-3, 1000, {}};
  costs[1] = {"parameter_server<async>", plan::strategy_kind::ps_async, false, true, 1e-3, 0.5e-3, 1.5e-3, 1500, {}};
  costs[2] = {"central_storage", plan::strategy_kind::central_storage, true, false, 0, 0, 0, 0, "refused"};
  auto r = plan::recommend(costs);
  CHECK(r.best == 1);
  CHECK(r.best_synchronous == 0);
  CHECK(r.reason.find("1.50x all_reduce<ring>") != std::string::npos);
  CHECK(r.caveat.find("fastest synchronous choice is all_reduce<ring>") != std::string::npos);
  CHECK(r.caveat.find("--simulate") != std::string::npos);
  costs[1].samples_per_second = 500;
  r = plan::recommend(costs);
  CHECK(r.best == 0);
  CHECK(r.caveat.find("synchronous") == 0);
  const auto [kind, what] = gw::testing::error_of([] { (void)plan::recommend({}); });
  CHECK(kind == gw::errc::invalid_argument);
}

TEST_CASE("recommend: with one available strategy the reason names no runner-up, and nothing past the span is read") {
  // The costs sit in a longer array; recommend gets only the first one or two. The entry
  // past the span is a faster strategy a reading past the end would name as the runner-up.
  std::vector<plan::strategy_cost> storage(3);
  storage[0] = {"all_reduce<ring>", plan::strategy_kind::all_reduce, true, true, 1e-3, 1e-3, 2e-3, 1000, {}};
  storage[1] = {"central_storage", plan::strategy_kind::central_storage, true, false, 0, 0, 0, 0, "refused"};
  storage[2] = {"past the span", plan::strategy_kind::all_reduce, true, true, 1e-3, 1e-3, 2e-3, 4000, {}};
  const std::string only_ring =
      "all_reduce<ring>: 1000 samples/s, a step of 2.000 ms (compute 1.000 + communication 1.000); communication is "
      "50% of its step";
  for (std::size_t given : {1, 2}) {  // alone, and beside an unavailable one
    CAPTURE(given);
    const auto r = plan::recommend(std::span<const plan::strategy_cost>(storage).first(given));
    CHECK(r.best == 0);
    CHECK(r.best_synchronous == 0);
    CHECK(r.any_synchronous);
    CHECK(r.reason == only_ring);
  }
}

namespace {
planner::plan_options parse(std::vector<const char*> args) {
  args.insert(args.begin(), "plan");
  return planner::parse_plan_options(static_cast<int>(args.size()), args.data());
}
void usage_error(std::vector<const char*> args, gw::errc expected, const std::string& says) {
  const auto [kind, what] = gw::testing::error_of([&] { (void)parse(args); });
  CAPTURE(what);
  CHECK(kind == expected);
  CHECK(what.find(says) != std::string::npos);
}
}  // namespace

TEST_CASE("the planner's options: defaults, and usage errors that say what to change") {
  const auto d = parse({});
  CHECK(d.work.parameters == 235146);  // Fashion-MNIST's MLP
  CHECK(d.work.tensors.size() == 6);
  CHECK(d.cluster.size() == 8);
  CHECK(d.servers == 1);
  const auto o = parse({"--params", "1000000", "--step-compute", "2ms", "--workers", "100", "--batch=32", "--cluster",
                        "hosts=25 ranks_per_host=4 bandwidth=10Gbit latency=20us jitter=0.1 tail=0.02:1.5"});
  CHECK(o.work.parameters == 1000000);
  CHECK(o.work.tensors.empty());
  CHECK(o.work.step_seconds == Approx(2e-3));
  CHECK(o.work.batch == 32);
  CHECK(o.cluster.size() == 100);
  CHECK(o.servers == 10);
  CHECK(o.backup_workers == 5);
  CHECK(parse({"--workers", "6"}).cluster.hosts == 6);
  CHECK(parse({"--flops-per-sample", "1M", "--device-flops", "1G", "--batch", "10"}).work.step_seconds == Approx(1e-2));
  CHECK(parse({"--help"}).help);

  using gw::errc;
  usage_error({"--colour", "blue"}, errc::invalid_argument, "unknown option '--colour'");
  usage_error({"--workers", "10", "--cluster", "hosts=4 ranks_per_host=2"}, errc::invalid_argument,
              "cluster has 4 hosts x 2 ranks = 8");
  usage_error({"--step-compute", "2 weeks"}, errc::invalid_argument, "a time > 0 such as 2ms");
  usage_error({"--step-compute", "0ms"}, errc::invalid_argument, "a time > 0");
  usage_error({"--device-flops", "5X"}, errc::invalid_argument, "optional K, M, G or T");
  usage_error({"--step-compute", "2ms", "--flops-per-sample", "1M"}, errc::invalid_argument, "give one of them");
  usage_error({"--params", "10", "--tensors", "4,5"}, errc::invalid_argument, "--tensors add up to 9");
  usage_error({"--tensors", "4x,5"}, errc::invalid_argument, "--tensors");
  {  // sizes alone: no shapes (PowerSGD priced near-square); a shape anywhere: the shapes
    const auto sizes = parse({"--tensors", "20,5"});
    CHECK(sizes.work.tensors == std::vector<std::size_t>{20, 5});
    CHECK(sizes.work.shapes.empty());
    const auto shapes = parse({"--tensors", "4x5,5,2x3x4"});
    CHECK(shapes.work.tensors == std::vector<std::size_t>{20, 5, 24});
    CHECK(shapes.work.parameters == 49);
    REQUIRE(shapes.work.shapes.size() == 3);
    CHECK(shapes.work.shapes[0] == gw::shape{4, 5});
    CHECK(shapes.work.shapes[2] == gw::shape{2, 3, 4});
    CHECK(d.work.shapes == planner::fashion_mnist_shapes);  // the default model's, as the example names them
  }
  usage_error({"--batch", "0"}, errc::invalid_argument, "--batch expects an integer >= 1");
  usage_error({"--backup-workers", "8"}, errc::invalid_argument, "below the 8 workers");
  usage_error({"--servers"}, errc::invalid_argument, "--servers needs a value");
  usage_error({"--cluster", "hosts=2 colour=blue"}, errc::config, "unknown key 'colour'");
  usage_error({"--cluster", "hosts=1"}, errc::invalid_argument, "nothing to distribute");
  usage_error({"--cluster", "x", "--cluster-file", "y"}, errc::invalid_argument, "give one");
  usage_error({"--cluster-file", "/nonexistent/cluster.txt"}, errc::config, "cannot read");
  usage_error({"--epochs", "2"}, errc::invalid_argument, "add --simulate");
  usage_error({"--simulate=yes"}, errc::invalid_argument, "--simulate takes no value");
  usage_error({"--simulate", "--params", "1000"}, errc::invalid_argument, "trains the Fashion-MNIST MLP");
  usage_error({"--simulate", "--target-accuracy", "88"}, errc::invalid_argument, "a fraction in (0, 1]");
}

namespace {
std::string after(const std::vector<std::string>& args, const std::string& flag) {
  const auto at = std::find(args.begin(), args.end(), flag);
  return at == args.end() || at + 1 == args.end() ? std::string() : *(at + 1);
}
}  // namespace

TEST_CASE("plan --simulate: fashion_mnist's command lines, and what it reads back from a run") {
  // 6 workers on 3 hosts of 2, 1 server: the servers' host is filled (2 servers), as the
  // simulator's hosts are all alike; backup workers and staleness round down to what
  // fashion_mnist has.
  const auto o = parse({"--simulate", "--cluster", "hosts=3 ranks_per_host=2 bandwidth=1Gbit", "--backup-workers", "3",
                        "--staleness", "3", "--period", "5", "--epochs", "2", "--lr=0.003", "--step-compute", "2ms"});
  CHECK(o.run.epochs == 2);
  CHECK(o.run.lr == 0.003);
  CHECK(o.run.async_lr == 1e-4);  // benchmarks/simulate_strategies.py's
  const auto strategies = planner::simulated_strategies(o);
  REQUIRE(strategies.size() == 8 + 4);  // and the four default codecs of --compress
  CHECK(strategies[2].name == "parameter_server<backup_workers<2>>");
  CHECK(strategies[4].name == "parameter_server<bounded_staleness<2>>");
  CHECK(strategies[5].name == "local_sgd (averaging<5>)");
  CHECK(strategies[6].name == "sharded (ZeRO-1)");
  CHECK(strategies[7].name == "diloco (H 5)");
  CHECK(strategies[11].name == "compressed all_reduce (powersgd:4)");
  CHECK(after(planner::fashion_mnist_command(o, "/bin/fashion_mnist", strategies[11]), "--compress") == "powersgd:4");
  const std::filesystem::path program = "/bin/fashion_mnist";
  for (const auto& st : strategies) {
    CAPTURE(st.name);
    const auto args = planner::fashion_mnist_command(o, program, st);
    CHECK(args.front() == program);
    const auto cluster = plan::parse_cluster_model(after(args, "--cluster"));
    CHECK(cluster.compute == plan::compute_model::modelled);
    CHECK(cluster.size() == 6 + st.servers);  // fashion_mnist refuses any other
    CHECK(cluster.network.bandwidth == 125e6);
    CHECK(after(args, "--replicas") == "6");
    CHECK(after(args, "--step-compute") == "0.002");
    CHECK(after(args, "--epochs") == "2");
    CHECK(after(args, "--ps") == (st.servers ? "2" : ""));
  }
  CHECK(after(planner::fashion_mnist_command(o, program, strategies[0]), "--lr") == "0.003");
  CHECK(after(planner::fashion_mnist_command(o, program, strategies[3]), "--ps-mode") == "async");
  CHECK(after(planner::fashion_mnist_command(o, program, strategies[3]), "--lr") == "0.0001");

  // fashion_mnist's lines: the chief's curve and target, the servers' counts (the first
  // server with gradients speaks for the job).
  const auto r = planner::parse_run_output(
      "curve epochs=0.2500 seconds=0.500000 accuracy=0.7000\n"
      "curve epochs=0.5000 seconds=1.000000 accuracy=0.8100\n"
      "ps rank 7: mode backup_workers version 10 updates 10 gradients 0 applied 0 dropped 0 staleness mean 0.00 p50 0\n"
      "ps rank 6: mode backup_workers version 10 updates 10 gradients 60 applied 50 dropped 10 staleness mean 0.50 p50 0\n"
      "simulated 1.250 s of virtual time\n"
      "final test accuracy 81.00% after 2 epochs, 1.0 s of training\n"
      "reached 80% test accuracy at epoch 0.50, 1.000 s\n");
  REQUIRE(r.reached);
  CHECK(*r.reached == 1.0);
  CHECK(r.final_accuracy == 0.81);
  CHECK(r.virtual_seconds == 1.25);
  CHECK(r.dropped == 10);
  CHECK(r.staleness_mean == 0.5);
  CHECK_FALSE(planner::parse_run_output("did not reach 88% test accuracy in 2 epochs\n").reached);
  // A program that is not there fails at once, saying what to do.
  planner::simulate_options missing;
  missing.fashion_mnist = "/nonexistent/fashion_mnist";
  const auto [kind, what] = gw::testing::error_of([&] { (void)planner::fashion_mnist_program(missing); });
  CHECK(kind == gw::errc::config);
  CHECK(what.find("--fashion-mnist PATH") != std::string::npos);
}

TEST_CASE("a bucketed all-reduce of unequal buckets: the sum of its calls, and a note naming them and what else runs") {
  const auto c = plan::parse_cluster_model("hosts=4 bandwidth=1GB latency=10us overhead=1us");
  const std::vector<std::size_t> buckets{1 << 20, 16, 1 << 20};  // auto_ runs one algorithm for 4 MiB, another for 64 B
  const auto big = plan::predict_all_reduce(c, all_reduce_algorithm::auto_, buckets[0]);
  const auto small = plan::predict_all_reduce(c, all_reduce_algorithm::auto_, buckets[1]);
  REQUIRE(big.runs != small.runs);
  const auto bucketed = plan::predict_bucketed_all_reduce(c, all_reduce_algorithm::auto_, buckets);
  CHECK(bucketed.seconds == Approx(2 * big.seconds + small.seconds));
  CHECK(bucketed.rounds == 2 * big.rounds + small.rounds);
  CHECK(bucketed.runs == big.runs);  // the first bucket's
  CHECK(bucketed.note == std::string("3 buckets; some buckets run ") + plan::name_of(small.runs));
  // Of one algorithm: the count alone.
  const auto ring = plan::predict_bucketed_all_reduce(c, all_reduce_algorithm::ring, buckets);
  CHECK(ring.note == "3 buckets");
}
