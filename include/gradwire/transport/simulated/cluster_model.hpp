// What a simulated cluster is: hosts x ranks, link rates and latencies, compute model, stragglers and faults.
//
// A cluster_model is plain data; parse_cluster_model reads it from a short text (the
// command line's --cluster "hosts=25 ranks_per_host=4 bandwidth=10Gbit latency=20us", or
// a file of such lines), so that the simulator (transport/simulated.hpp), the analytic
// cost models (plan/cost_model.hpp) and the planner (examples/plan) read one format.
//
// Keys (units optional; times take ns, us, ms, s; rates take bit, Kbit, Mbit, Gbit, B,
// KB, MB, GB, per second; a bare number is seconds or bytes/s):
//   hosts=H ranks_per_host=R       the layout: rank r is on host r / R (default 1 x 1)
//   bandwidth=RATE latency=TIME    each host's network link, both directions (1Gbit, 50us)
//   local_bandwidth= local_latency=  between ranks of one host (10GB, 2us)
//   overhead=TIME                  CPU time a rank spends per message it sends or receives
//   compute=measured|modelled      measured: a rank's CPU time between transport calls counts
//                                  (times its speed); modelled: only simulation::compute(d) does
//   speed=F                        every rank's compute time is multiplied by F (default 1)
//   slow=RANK:F                    rank RANK is F times slower (repeat for several ranks)
//   jitter=SIGMA                   per step, each rank's compute is multiplied by exp(SIGMA * Z),
//                                  Z standard normal (the body of the step-time distribution)
//   tail=P:ALPHA[:CAP]             per step, with probability P, also by a Pareto(ALPHA) factor
//                                  >= 1, at most CAP (default 20): the long tail of stragglers
//   die=RANK@TIME                  rank RANK dies at virtual time TIME (repeatable)
//   restart=RANK@TIME              a replacement of rank RANK starts at TIME, after it died (as
//                                  GRADWIRE_REJOIN=1 starts one: its function runs again, and its
//                                  endpoint's rejoined() is true; repeatable)
//   seed=S                         of every random draw (default 1)
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../../error.hpp"
#include "../../support/topology.hpp"

namespace gradwire::simulation {

// Virtual time: nanoseconds since the simulation began.
using duration = std::chrono::nanoseconds;
using time_point = std::chrono::nanoseconds;

// One kind of link: how long a message of n bytes takes on it alone, latency + n / bandwidth.
struct link_model {
  double bandwidth = 125e6;  // bytes per second
  duration latency{std::chrono::microseconds(50)};

  duration transfer(std::size_t bytes) const noexcept {
    return duration(static_cast<std::int64_t>(std::llround(double(bytes) / bandwidth * 1e9)));
  }
  duration one_message(std::size_t bytes) const noexcept { return latency + transfer(bytes); }
};

enum class compute_model : std::uint8_t { measured, modelled };

// How a rank's compute time per step is stretched: a fixed factor per rank, a log-normal
// body and a Pareto tail (see the top of this header and docs/planning.md for why).
struct straggler_model {
  std::vector<std::pair<int, double>> slow;  // {rank, factor}
  double jitter = 0;                         // sigma of the log-normal body; 0: none
  double tail_probability = 0;               // of a straggling step
  double tail_alpha = 1.5;                   // Pareto shape: smaller is a heavier tail
  double tail_cap = 20;                      // the largest tail factor

  double fixed_factor(int rank) const noexcept {
    double f = 1;
    for (const auto& [r, factor] : slow)
      if (r == rank) f *= factor;
    return f;
  }
  bool random() const noexcept { return jitter > 0 || tail_probability > 0; }

  // One step's random factor: exp(jitter * Z) times, with probability tail_probability,
  // min(cap, U^(-1/alpha)) (Pareto with minimum 1). Draws the same numbers from the same
  // generator state on every platform (no std:: distributions, whose algorithms differ).
  template <class Rng>
  double draw(Rng& rng) const {
    auto uniform = [&] { return (double(rng() >> 11) + 0.5) * 0x1.0p-53; };  // in (0, 1)
    double f = 1;
    if (jitter > 0) {  // Box-Muller
      const double z = std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
      f *= std::exp(jitter * z);
    }
    if (tail_probability > 0 && uniform() < tail_probability)
      f *= std::min(tail_cap, std::pow(uniform(), -1.0 / tail_alpha));
    return f;
  }
};

struct rank_death {
  int rank = 0;
  time_point at{};
};

struct cluster_model {
  int hosts = 1;
  int ranks_per_host = 1;
  link_model network{125e6, std::chrono::microseconds(50)};
  link_model local{10e9, std::chrono::microseconds(2)};
  duration overhead{};
  compute_model compute = compute_model::measured;
  double speed = 1;
  straggler_model stragglers;
  std::vector<rank_death> deaths;
  std::vector<rank_death> restarts;  // when a dead rank's replacement starts
  std::uint64_t seed = 1;

  int size() const noexcept { return hosts * ranks_per_host; }
  int host(int rank) const noexcept { return rank / ranks_per_host; }
  const link_model& link_between(int a, int b) const noexcept { return host(a) == host(b) ? local : network; }

  cluster::topology topology() const {
    std::vector<int> labels(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) labels[static_cast<std::size_t>(r)] = host(r);
    std::vector<std::string> names;
    for (int h = 0; h < hosts; ++h) names.push_back("sim-host-" + std::to_string(h));
    return cluster::topology(std::move(labels), std::move(names));
  }

  // The most ranks a model may have: every rank is a thread of the simulating process.
  static constexpr long long max_ranks = 100000;

  // Throws errc::config naming what is wrong.
  void validate() const {
    auto bad = [](const std::string& what) { throw error(errc::config, "simulated cluster: " + what); };
    auto finite_positive = [](double v) { return std::isfinite(v) && v > 0; };
    if (hosts < 1 || ranks_per_host < 1) bad("hosts and ranks_per_host must be >= 1");
    if (static_cast<long long>(hosts) * ranks_per_host > max_ranks)
      bad("hosts x ranks_per_host must be at most " + std::to_string(max_ranks) + " ranks");
    if (!finite_positive(network.bandwidth) || !finite_positive(local.bandwidth))
      bad("bandwidths must be finite and > 0");
    if (network.latency.count() < 0 || local.latency.count() < 0 || overhead.count() < 0)
      bad("latencies and overhead must be >= 0");
    if (!finite_positive(speed)) bad("speed must be finite and > 0");
    for (const auto& [r, f] : stragglers.slow)
      if (r < 0 || r >= size() || !finite_positive(f)) bad("slow=" + std::to_string(r) + ":" + std::to_string(f) + ": rank or factor out of range");
    if (!(stragglers.jitter >= 0 && stragglers.jitter <= 10) || !(stragglers.tail_probability >= 0) ||
        stragglers.tail_probability > 1 || !finite_positive(stragglers.tail_alpha) ||
        !(stragglers.tail_cap >= 1 && std::isfinite(stragglers.tail_cap)))
      bad("jitter in [0, 10], tail probability in [0, 1], alpha > 0, cap >= 1 (all finite)");
    for (const auto& d : deaths)
      if (d.rank < 0 || d.rank >= size() || d.at.count() < 0) bad("die=" + std::to_string(d.rank) + ": no such rank");
    for (const auto& s : restarts) {
      if (s.rank < 0 || s.rank >= size() || s.at.count() < 0) bad("restart=" + std::to_string(s.rank) + ": no such rank");
      const bool died_before = std::any_of(deaths.begin(), deaths.end(), [&](const rank_death& d) {
        return d.rank == s.rank && d.at <= s.at;
      });
      if (!died_before)
        bad("restart=" + std::to_string(s.rank) + "@...: rank " + std::to_string(s.rank) +
            " does not die before it (a replacement takes a dead rank's place: die=" + std::to_string(s.rank) + "@...)");
    }
  }
};

namespace detail {

[[noreturn]] inline void bad_value(std::string_view key, std::string_view value, std::string_view expected) {
  throw error(errc::config, "simulated cluster: " + std::string(key) + "=" + std::string(value) + ": expected " +
                                std::string(expected));
}

// "12.5" followed by a unit; returns the number and leaves the unit in `unit`.
inline double number_and_unit(std::string_view key, std::string_view text, std::string_view& unit) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) bad_value(key, text, "a number");
  unit = text.substr(static_cast<std::size_t>(end - text.data()));
  return value;
}

inline duration parse_time(std::string_view key, std::string_view text) {
  std::string_view unit;
  const double v = number_and_unit(key, text, unit);
  double scale = 0;
  if (unit == "ns") scale = 1;
  else if (unit == "us") scale = 1e3;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "s" || unit.empty()) scale = 1e9;
  else bad_value(key, text, "a time such as 50us, 2ms or 1.5s");
  // Up to a century of virtual time: nanoseconds in 64 bits go to 292 years.
  if (!(v >= 0) || !(v * scale <= 3.2e18)) bad_value(key, text, "a time from 0 to 100 years");
  return duration(static_cast<std::int64_t>(std::llround(v * scale)));
}

inline double parse_rate(std::string_view key, std::string_view text) {
  std::string_view unit;
  const double v = number_and_unit(key, text, unit);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "bit") scale = 1.0 / 8;
  else if (unit == "Kbit") scale = 1e3 / 8;
  else if (unit == "Mbit") scale = 1e6 / 8;
  else if (unit == "Gbit") scale = 1e9 / 8;
  else bad_value(key, text, "a rate such as 1Gbit, 119MB or 10GB (per second)");
  if (!(v > 0) || !std::isfinite(v * scale)) bad_value(key, text, "a finite rate > 0");
  return v * scale;
}

inline double parse_double(std::string_view key, std::string_view text) {
  std::string_view unit;
  const double v = number_and_unit(key, text, unit);
  if (!unit.empty() || !std::isfinite(v)) bad_value(key, text, "a finite plain number");
  return v;
}

inline std::uint64_t parse_seed(std::string_view key, std::string_view text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) bad_value(key, text, "an unsigned 64-bit integer");
  return v;
}

inline int parse_int(std::string_view key, std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) bad_value(key, text, "an integer");
  return v;
}

// "A<sep>B" split at the first `sep`.
inline std::pair<std::string_view, std::string_view> split(std::string_view key, std::string_view text, char sep,
                                                           std::string_view expected) {
  const auto at = text.find(sep);
  if (at == std::string_view::npos) bad_value(key, text, expected);
  return {text.substr(0, at), text.substr(at + 1)};
}

}  // namespace detail

// Sets one key of `m` (see the top of this header); throws errc::config on an unknown key
// or a malformed value.
inline void set_cluster_key(cluster_model& m, std::string_view key, std::string_view value) {
  using namespace detail;
  if (key == "hosts") m.hosts = parse_int(key, value);
  else if (key == "ranks_per_host") m.ranks_per_host = parse_int(key, value);
  else if (key == "bandwidth") m.network.bandwidth = parse_rate(key, value);
  else if (key == "latency") m.network.latency = parse_time(key, value);
  else if (key == "local_bandwidth") m.local.bandwidth = parse_rate(key, value);
  else if (key == "local_latency") m.local.latency = parse_time(key, value);
  else if (key == "overhead") m.overhead = parse_time(key, value);
  else if (key == "compute") {
    if (value == "measured") m.compute = compute_model::measured;
    else if (value == "modelled") m.compute = compute_model::modelled;
    else bad_value(key, value, "measured or modelled");
  } else if (key == "speed") m.speed = parse_double(key, value);
  else if (key == "slow") {
    const auto [rank, factor] = split(key, value, ':', "RANK:FACTOR");
    m.stragglers.slow.emplace_back(parse_int(key, rank), parse_double(key, factor));
  } else if (key == "jitter") m.stragglers.jitter = parse_double(key, value);
  else if (key == "tail") {
    const auto [p, rest] = split(key, value, ':', "P:ALPHA[:CAP]");
    m.stragglers.tail_probability = parse_double(key, p);
    const auto cap_at = rest.find(':');
    m.stragglers.tail_alpha = parse_double(key, rest.substr(0, cap_at));
    if (cap_at != std::string_view::npos) m.stragglers.tail_cap = parse_double(key, rest.substr(cap_at + 1));
  } else if (key == "die") {
    const auto [rank, at] = split(key, value, '@', "RANK@TIME");
    m.deaths.push_back({parse_int(key, rank), parse_time(key, at)});
  } else if (key == "restart") {
    const auto [rank, at] = split(key, value, '@', "RANK@TIME");
    m.restarts.push_back({parse_int(key, rank), parse_time(key, at)});
  } else if (key == "seed") {
    m.seed = parse_seed(key, value);
  } else {
    throw error(errc::config, "simulated cluster: unknown key '" + std::string(key) +
                                  "' (hosts, ranks_per_host, bandwidth, latency, local_bandwidth, local_latency, "
                                  "overhead, compute, speed, slow, jitter, tail, die, restart, seed)");
  }
}

// Applies "key=value" words separated by spaces, commas or new lines (# starts a comment
// to the end of its line) to `m`, and validates the result.
inline cluster_model parse_cluster_model(std::string_view text, cluster_model m = {}) {
  std::string word;
  bool comment = false;
  auto flush = [&] {
    if (word.empty()) return;
    const auto eq = word.find('=');
    if (eq == std::string::npos || eq == 0)
      throw error(errc::config, "simulated cluster: '" + word + "' is not key=value");
    set_cluster_key(m, std::string_view(word).substr(0, eq), std::string_view(word).substr(eq + 1));
    word.clear();
  };
  for (char c : text) {
    if (c == '\n') comment = false;
    if (comment) continue;
    if (c == '#') {
      flush();
      comment = true;
    } else if (c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r') {
      flush();
    } else {
      word += c;
    }
  }
  flush();
  m.validate();
  return m;
}

// As parse_cluster_model, from a file of such lines.
inline cluster_model load_cluster_model(const std::string& path, cluster_model m = {}) {
  std::ifstream in(path);
  if (!in) throw error(errc::config, "simulated cluster: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_cluster_model(text.str(), std::move(m));
}

// One line that parse_cluster_model reads back as `m` (for reports and traces): rates in
// bytes/s and times in nanoseconds, exactly; factors to 17 significant digits.
inline std::string describe(const cluster_model& m) {
  auto number = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return std::string(text);
  };
  auto rate = [&](double bytes_per_s) { return number(bytes_per_s) + "B"; };
  auto time = [](duration d) { return std::to_string(d.count()) + "ns"; };
  std::ostringstream s;
  s << "hosts=" << m.hosts << " ranks_per_host=" << m.ranks_per_host << " bandwidth=" << rate(m.network.bandwidth)
    << " latency=" << time(m.network.latency) << " local_bandwidth=" << rate(m.local.bandwidth)
    << " local_latency=" << time(m.local.latency) << " overhead=" << time(m.overhead)
    << " compute=" << (m.compute == compute_model::measured ? "measured" : "modelled") << " speed=" << number(m.speed);
  for (const auto& [r, f] : m.stragglers.slow) s << " slow=" << r << ':' << number(f);
  if (m.stragglers.jitter > 0) s << " jitter=" << number(m.stragglers.jitter);
  if (m.stragglers.tail_probability > 0)
    s << " tail=" << number(m.stragglers.tail_probability) << ':' << number(m.stragglers.tail_alpha) << ':'
      << number(m.stragglers.tail_cap);
  for (const auto& d : m.deaths) s << " die=" << d.rank << '@' << time(d.at);
  for (const auto& d : m.restarts) s << " restart=" << d.rank << '@' << time(d.at);
  s << " seed=" << m.seed;
  return s.str();
}

}  // namespace gradwire::simulation
