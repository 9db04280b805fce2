// Tutorial: a user-written transport decorator, throttled<Inner>.
//
// throttled wraps any transport and makes it behave like a slower network: each rank's
// link carries at most `bytes_per_second` each way, and every message arrives `latency`
// later. It forwards the optional capabilities (receive-and-add, fail, wait_any, loss
// tolerance) exactly when the wrapped transport has them, so strategies compose with it
// as with the transport itself. main() trains a least-squares model with
// aggregation::all_reduce and with a synchronous parameter server over
// throttled<transport::inproc>, and checks that:
//   - the parameters match a float64 serial reference, and are equal on every replica;
//   - the throttle really throttles: every rank took at least (its bytes) / rate, and at
//     least steps * latency with a latency alone;
//   - the concepts still hold (static_asserts below).
// Exits non-zero when a check fails. See docs/tutorial.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradwire/gradwire.hpp>

#include "least_squares.hpp"

namespace gw = gradwire;

// [docs:throttled_class]
// throttled<Inner>: Inner slowed down to a given link. Each rank's link moves at most
// bytes_per_second in each direction, one message after another (a send occupies the
// outgoing side, a receive the incoming side, from when it was posted), and a message is
// complete `latency` after its last byte. Operations start at once, as Inner's do; wait()
// holds a completion back until the emulated link would have delivered it. Only messages
// that complete occupy the link. Copies share one link.
//   Inner: concepts::transport
template <class Inner>
class throttled {
  enum class side { out = 0, in = 1 };

 public:
  using inner_type = Inner;

  struct options {
    double bytes_per_second = 0;           // per direction; 0: no bandwidth limit
    std::chrono::microseconds latency{0};  // added to every message
  };

  // Inner's request, plus what the link needs to know about it. Destroying it unfinished
  // destroys Inner's request, which withdraws the operation.
  class request {
   public:
    request() = default;  // when Inner's is (any_transport and one-shot all-reduce want it)
    // Whether it still holds an operation (parameter servers test their requests so).
    explicit operator bool() const { return static_cast<bool>(inner_); }

   private:
    friend class throttled;
    request(typename Inner::request inner, side s, std::size_t bytes)
        : inner_(std::move(inner)), side_(s), bytes_(bytes), posted_(gw::clock::now()) {}
    typename Inner::request inner_;
    side side_ = side::out;
    std::size_t bytes_ = 0;
    gw::deadline posted_{};
    std::optional<gw::deadline> delivered_;  // booked on the link when first waited for
  };

  throttled(Inner inner, options o) : inner_(std::move(inner)), options_(o), link_(std::make_shared<link>()) {
    if (!(o.bytes_per_second >= 0) || o.latency.count() < 0)
      throw gw::error(gw::errc::invalid_argument, "throttled: bytes_per_second and latency must be >= 0");
  }
  // [/docs:throttled_class]

  // [docs:throttled_required]
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }

  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> bytes) {
    return {inner_.async_send(peer, tag, bytes), side::out, bytes.size()};
  }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> bytes) {
    return {inner_.async_recv(peer, tag, bytes), side::in, bytes.size()};
  }
  // Inner's wait first (the bytes have moved), then the link's time. A message the link
  // cannot deliver by `until` is a timeout, as it would be on a slow network.
  void wait(request& r, gw::deadline until) {
    inner_.wait(r.inner_, until);
    hold_until(delivery(r), until);
  }
  // [/docs:throttled_required]

  // [docs:throttled_optional]
  // Optional capabilities: each exists only when Inner has it, so that the concepts (and
  // the algorithms that test for them with if constexpr) see throttled<Inner> exactly as
  // capable as Inner.
  template <class V>
    requires gw::concepts::accumulating_transport<Inner, V>
  request async_recv_accumulate(int peer, std::uint64_t tag, std::span<V> inout) {
    return {inner_.async_recv_accumulate(peer, tag, inout), side::in, inout.size_bytes()};
  }

  void fail(gw::errc cause, const std::string& reason)
    requires gw::concepts::failable_transport<Inner>
  {
    inner_.fail(cause, reason);
  }

  // The index of a request that wait() then completes at once: Inner picks one that its
  // peer has matched, and this waits out the link's time for it.
  std::size_t wait_any(std::span<request* const> requests, gw::deadline until)
    requires gw::concepts::multiplexing_transport<Inner>
  {
    inner_requests_.clear();  // reused: a parameter server calls this once per message
    for (request* r : requests) inner_requests_.push_back(r ? &r->inner_ : nullptr);
    const std::size_t i = inner_.wait_any(std::span<typename Inner::request* const>(inner_requests_), until);
    hold_until(delivery(*requests[i]), until);
    return i;
  }

  void tolerate_loss(int peer)
    requires gw::concepts::loss_tolerant_transport<Inner>
  {
    inner_.tolerate_loss(peer);
  }
  std::vector<int> lost_peers() const
    requires gw::concepts::loss_tolerant_transport<Inner>
  {
    return inner_.lost_peers();
  }
  bool tolerates_loss() const
    requires gw::concepts::loss_tolerant_transport<Inner>
  {
    return gw::concepts::tolerates_loss(inner_);
  }
  // Inner's count of the payload posted (what strategy::last_step_stats() reports).
  gw::support::traffic_counters traffic() const
    requires gw::concepts::metered_transport<Inner>
  {
    return inner_.traffic();
  }
  // Which ranks share a host, as Inner knows it (hierarchical all-reduce reads it).
  const gw::cluster::topology& topology() const
    requires gw::concepts::topology_aware_transport<Inner>
  {
    return inner_.topology();
  }
  // Deliberately not forwarded: shares_address_space (device collectives would read the
  // peers' memory directly and bypass the link) and one-sided access (not throttled here).
  // [/docs:throttled_optional]

  // What the link has carried, in bytes: messages that completed (traffic() counts what
  // was posted, including operations withdrawn unfinished).
  std::uint64_t bytes_sent() const { return carried(side::out); }
  std::uint64_t bytes_received() const { return carried(side::in); }
  const options& settings() const noexcept { return options_; }

 private:
  // [docs:throttled_link]
  // One rank's link: when each side is next free, and what it has carried.
  struct link {
    std::mutex mutex;  // a strategy may wait from its engine thread and its own
    struct side_state {
      gw::deadline free_at{};
      std::uint64_t bytes = 0;
    } sides[2];
  };

  // When the link delivers r: booked once, when r is first waited for, on r's side of the
  // link, no earlier than r was posted and than the side's previous message finished.
  // Booked intervals never overlap, so a rank that waited for all its messages took at
  // least (bytes of each side) / bytes_per_second.
  gw::deadline delivery(request& r) {
    if (!r.delivered_) {
      std::lock_guard lock(link_->mutex);
      auto& s = link_->sides[static_cast<int>(r.side_)];
      const auto start = std::max(r.posted_, s.free_at);
      s.free_at = start + transfer_time(r.bytes_);
      s.bytes += r.bytes_;
      r.delivered_ = s.free_at + options_.latency;
    }
    return *r.delivered_;
  }

  gw::clock::duration transfer_time(std::size_t bytes) const {
    if (options_.bytes_per_second == 0) return gw::clock::duration::zero();
    return std::chrono::ceil<gw::clock::duration>(
        std::chrono::duration<double>(double(bytes) / options_.bytes_per_second));
  }

  static void hold_until(gw::deadline delivered, gw::deadline until) {
    if (delivered > until) {
      std::this_thread::sleep_until(until);
      throw gw::error(gw::errc::timeout, "throttled: the emulated link delivers this message after its deadline "
                                         "(raise the timeout or bytes_per_second)");
    }
    std::this_thread::sleep_until(delivered);
  }
  // [/docs:throttled_link]

  std::uint64_t carried(side s) const {
    std::lock_guard lock(link_->mutex);
    return link_->sides[static_cast<int>(s)].bytes;
  }

  Inner inner_;
  options options_;
  std::shared_ptr<link> link_;
  std::vector<typename Inner::request*> inner_requests_;
};

// [docs:throttled_concepts]
using slow_inproc = throttled<gw::transport::inproc>;
static_assert(gw::concepts::transport<slow_inproc>);
static_assert(gw::concepts::accumulating_transport<slow_inproc, float> &&
              gw::concepts::accumulating_transport<slow_inproc, double>);
static_assert(gw::concepts::failable_transport<slow_inproc> && gw::concepts::multiplexing_transport<slow_inproc>);
static_assert(gw::concepts::metered_transport<slow_inproc> && gw::concepts::topology_aware_transport<slow_inproc>);
static_assert(!gw::concepts::shared_address_space_transport<slow_inproc>);  // on purpose, see above
// Around a transport without the optional capabilities, the decorator has none either.
using slow_local = throttled<gw::transport::local>;
static_assert(gw::concepts::transport<slow_local>);
static_assert(!gw::concepts::accumulating_transport<slow_local, float>);
static_assert(!gw::concepts::failable_transport<slow_local> && !gw::concepts::multiplexing_transport<slow_local>);
static_assert(!gw::concepts::loss_tolerant_transport<slow_local>);
// Decorators compose, and type erasure takes them.
static_assert(gw::concepts::accumulating_transport<throttled<slow_inproc>, float>);
static_assert(std::constructible_from<gw::transport::any_transport, slow_inproc>);
// [/docs:throttled_concepts]

namespace {

constexpr std::size_t features = 2048;  // w: 2048 weights, plus a bias tensor of 1
constexpr std::size_t samples_per_shard = 256;
constexpr int workers = 3;  // all-reduce: 3 replicas; parameter server: 3 workers + 1 server
constexpr int steps = 30;
constexpr double lr = 0.05;
constexpr double rate = 1e6;  // bytes per second per direction: a 1 MB/s link
constexpr auto latency = std::chrono::milliseconds(2);

using problem = tutorial::least_squares;

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

struct rank_report {
  double seconds = 0;  // constructing the strategy (setup) and every step
  std::uint64_t sent = 0, received = 0;
  std::vector<float> parameters;  // after the last step (workers only)
  std::uint64_t stats_sent = 0;   // what strategy::cumulative_stats() saw sent (workers only)
  bool server = false;
};

std::vector<gw::host_tensor<float>> start_parameters(int rank) {
  std::vector<gw::host_tensor<float>> p;
  p.emplace_back(gw::shape{features});
  p.emplace_back(gw::shape{1});
  for (auto& t : p) std::fill(t.span().begin(), t.span().end(), rank == 0 ? 0.0f : 50.0f);  // setup must fix rank > 0
  return p;
}

// Runs `ranks` threads over throttled inproc endpoints; each trains (or serves) with the
// strategy make(transport, parameters) returns.
template <class Make>
std::vector<rank_report> train(const problem& data, int ranks, slow_inproc::options link, Make make) {
  std::vector<rank_report> reports(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc endpoint) {
    const int r = endpoint.rank();
    rank_report& report = reports[r];
    const auto started = gw::clock::now();
    auto s = make(slow_inproc(endpoint, link), start_parameters(r));
    bool served = false;
    if constexpr (requires { s.serve(); })
      if (s.is_server()) s.serve(), served = true;
    report.server = served;
    if (!served) {
      std::vector<std::vector<float>> grads{std::vector<float>(features), std::vector<float>(1)};
      for (int t = 0; t < steps; ++t) {
        const auto w = s.parameters()[0].span();
        data.gradient<float>(r, w, s.parameters()[1][0], grads[0], grads[1][0]);
        s.step(grads);
      }
      report.parameters.assign(s.parameters()[0].data(), s.parameters()[0].data() + features);
      report.parameters.push_back(s.parameters()[1][0]);
      // Measured only because throttled forwards traffic() (concepts::metered_transport).
      if (s.cumulative_stats().traffic_measured) report.stats_sent = s.cumulative_stats().traffic.bytes_sent;
    }
    report.seconds = std::chrono::duration<double>(gw::clock::now() - started).count();
    // The strategy owns the transport; the decorator's own members are one call away.
    report.sent = s.communicator().transport().bytes_sent();
    report.received = s.communicator().transport().bytes_received();
  });
  return reports;
}

// [docs:throttled_use]
auto all_reduce_over(slow_inproc transport, std::vector<gw::host_tensor<float>> parameters) {
  using strategy = gw::strategy<gw::host_tensor<float>, gw::optim::sgd, gw::aggregation::all_reduce, slow_inproc>;
  return strategy(std::move(transport), std::move(parameters), gw::optim::sgd({.lr = lr}),
                  gw::aggregation::all_reduce(), {.timeout = std::chrono::seconds(60)});
}

auto parameter_server_over(slow_inproc transport, std::vector<gw::host_tensor<float>> parameters) {
  using strategy = gw::parameter_server<gw::host_tensor<float>, gw::optim::sgd, gw::ps::sync, slow_inproc>;
  gw::ps::options ps;
  ps.servers = 1;
  ps.timeout = std::chrono::seconds(60);
  return strategy(std::move(transport), std::move(parameters), gw::optim::sgd({.lr = lr}),
                  strategy::aggregation_type(ps));
}
// [/docs:throttled_use]

// Parameters within float rounding of the float64 reference, and equal on every worker.
void check_parameters(const std::vector<rank_report>& reports, const std::vector<double>& reference,
                      const std::string& name) {
  double worst = 0, scale = 0;
  bool identical = true;
  const rank_report* first = nullptr;
  for (const auto& r : reports) {
    if (r.server) continue;
    if (!first) first = &r;
    identical = identical && r.parameters == first->parameters;
    for (std::size_t j = 0; j < reference.size(); ++j) {
      worst = std::max(worst, std::abs(double(r.parameters[j]) - reference[j]));
      scale = std::max(scale, std::abs(reference[j]));
    }
  }
  if (!first) return check(false, name + ": no worker reported parameters");
  char what[200];
  std::snprintf(what, sizeof what, "%s: parameters match the float64 reference (max |difference| %.1e <= %.1e)",
                name.c_str(), worst, 1e-5 * scale);
  check(worst <= 1e-5 * scale, what);
  check(identical, name + ": every worker holds the same parameters");
}

// Every rank took at least as long as its link needs for the bytes it sent and received.
void check_bandwidth_bound(const std::vector<rank_report>& reports, double bytes_per_second, const std::string& name) {
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const double floor = double(std::max(reports[r].sent, reports[r].received)) / bytes_per_second;
    char what[200];
    std::snprintf(what, sizeof what, "%s: rank %zu took %.3f s >= %.3f s = max(sent %llu, received %llu) B / rate",
                  name.c_str(), r, reports[r].seconds, floor, static_cast<unsigned long long>(reports[r].sent),
                  static_cast<unsigned long long>(reports[r].received));
    check(reports[r].seconds >= floor && reports[r].sent > 0, what);
  }
}

double slowest(const std::vector<rank_report>& reports) {
  double s = 0;
  for (const auto& r : reports) s = std::max(s, r.seconds);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::uint32_t seed = argc > 1 ? static_cast<std::uint32_t>(std::stoul(argv[1])) : 7u;
    const problem data(workers, features, samples_per_shard, seed);
    const auto reference = data.reference(lr, steps).back();

    const slow_inproc::options unlimited{}, bandwidth{.bytes_per_second = rate}, delay{.latency = latency};
    const auto ar_free = train(data, workers, unlimited, all_reduce_over);
    const auto ar_slow = train(data, workers, bandwidth, all_reduce_over);
    const auto ar_delay = train(data, workers, delay, all_reduce_over);
    const auto ps_free = train(data, workers + 1, unlimited, parameter_server_over);
    const auto ps_slow = train(data, workers + 1, bandwidth, parameter_server_over);

    check_parameters(ar_free, reference, "all_reduce, unthrottled");
    check_parameters(ar_slow, reference, "all_reduce, 1 MB/s");
    check_parameters(ar_delay, reference, "all_reduce, 2 ms latency");
    check_parameters(ps_free, reference, "parameter_server sync, unthrottled");
    check_parameters(ps_slow, reference, "parameter_server sync, 1 MB/s");
    check_bandwidth_bound(ar_slow, rate, "all_reduce, 1 MB/s");
    check_bandwidth_bound(ps_slow, rate, "parameter_server sync, 1 MB/s");
    // The strategy's own step statistics see the traffic through the decorator: what the
    // steps posted, no more than the link carried in setup and steps together.
    for (std::size_t r = 0; r < ar_slow.size(); ++r)
      check(ar_slow[r].stats_sent > 0 && ar_slow[r].stats_sent <= ar_slow[r].sent,
            "all_reduce, 1 MB/s: rank " + std::to_string(r) + "'s step statistics measured " +
                std::to_string(ar_slow[r].stats_sent) + " bytes sent through the decorator");
    // Each step of an all-reduce waits for at least one message of its own, so with a
    // latency alone every replica's steps take at least steps * latency in all.
    const double latency_floor = steps * std::chrono::duration<double>(latency).count();
    for (std::size_t r = 0; r < ar_delay.size(); ++r)
      check(ar_delay[r].seconds >= latency_floor,
            "all_reduce, 2 ms latency: rank " + std::to_string(r) + " took " + std::to_string(ar_delay[r].seconds) +
                " s >= " + std::to_string(latency_floor) + " s = steps * latency");

    std::printf("\n%d workers, least squares with %zu + 1 float parameters, %d steps; link: 1 MB/s each way or "
                "2 ms per message\n\n",
                workers, features, steps);
    std::printf("| strategy | link | slowest rank (s) | busiest rank: sent / received (bytes) | bytes / rate (s) |\n");
    std::printf("|---|---|---|---|---|\n");
    auto row = [](const char* strategy, const char* link, const std::vector<rank_report>& reports, bool bounded) {
      std::uint64_t sent = 0, received = 0;
      for (const auto& r : reports)
        if (std::max(r.sent, r.received) > std::max(sent, received)) sent = r.sent, received = r.received;
      char floor[32] = "-";
      if (bounded) std::snprintf(floor, sizeof floor, "%.3f", double(std::max(sent, received)) / rate);
      std::printf("| %s | %s | %.3f | %llu / %llu | %s |\n", strategy, link, slowest(reports),
                  static_cast<unsigned long long>(sent), static_cast<unsigned long long>(received), floor);
    };
    row("all_reduce", "unthrottled", ar_free, false);
    row("all_reduce", "1 MB/s", ar_slow, true);
    row("all_reduce", "2 ms latency", ar_delay, false);
    row("parameter_server sync, 1 server", "unthrottled", ps_free, false);
    row("parameter_server sync, 1 server", "1 MB/s", ps_slow, true);
    std::printf("\n%d failed check(s)\n", failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "throttled_transport: %s\n", e.what());
    return 1;
  }
}
