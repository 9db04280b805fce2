// Helpers shared by the collective tests: per-rank random inputs, float64 references, a staging-only transport.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <gradwire/collective/communicator.hpp>
#include <gradwire/error.hpp>
#include <gradwire/transport/inproc.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "helpers/reference.hpp"

namespace gradwire::test {

// Catch2 v2 assertions are not thread-safe: rank threads check with this, and the
// failure reaches the test through run_inproc's rethrow.
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

// Rank r's input: fresh random values in [-1, 1] from a seed that differs per run and rank.
template <class V>
std::vector<V> random_input(std::uint64_t seed, int rank, std::size_t n) {
  std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<V> v(n);
  for (auto& x : v) x = static_cast<V>(dist(gen));
  return v;
}

// Serial float64 sum (or average) in rank order of what each rank holds.
template <class V>
std::vector<double> serial_reduce(const std::vector<std::vector<V>>& data, bool average) {
  const std::size_t n = data.empty() ? 0 : data[0].size();
  std::vector<double> expected(n, 0.0);
  for (const auto& d : data)
    for (std::size_t i = 0; i < n; ++i) expected[i] += static_cast<double>(d[i]);
  if (average)
    for (auto& e : expected) e /= static_cast<double>(data.size());
  return expected;
}

// Each element is a sum of `ranks` values in [-1, 1]: the rounding of any summation order
// is bounded by ranks * eps * (sum of magnitudes) <= ranks^2 * eps.
template <class V>
double sum_tolerance(int ranks) {
  return 4.0 * ranks * ranks * std::numeric_limits<V>::epsilon();
}

// Elements of got[begin, end) further than `tolerance` from expected (NaN counts).
template <class V>
std::size_t count_wrong(const std::vector<V>& got, const std::vector<double>& expected, double tolerance,
                        std::size_t begin, std::size_t end) {
  if (got.size() != expected.size() || end > got.size() || begin > end) return std::size_t(-1);
  const V* g = got.data();
  const double* e = expected.data();
  std::size_t wrong = 0;
  for (std::size_t i = begin; i < end; ++i)
    if (!(std::abs(static_cast<double>(g[i]) - e[i]) <= tolerance)) ++wrong;
  return wrong;
}
template <class V>
std::size_t count_wrong(const std::vector<V>& got, const std::vector<double>& expected, double tolerance) {
  return count_wrong(got, expected, tolerance, 0, got.size());
}

// inproc without its fused receive-and-add: collectives then stage incoming data in
// scratch, the path every transport without concepts::accumulating_transport takes.
struct staging_only {
  using request = transport::inproc::request;
  // Pipelined like inproc: the ring's staged path is tested segment by segment too.
  static constexpr std::size_t ring_segment_bytes = transport::inproc::ring_segment_bytes;
  transport::inproc inner;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  request async_send(int peer, std::uint64_t tag, std::span<const std::byte> b) { return inner.async_send(peer, tag, b); }
  request async_recv(int peer, std::uint64_t tag, std::span<std::byte> b) { return inner.async_recv(peer, tag, b); }
  void wait(request& r, deadline until) { inner.wait(r, until); }
};

// A rank's outcome: its error's kind ({} for success) and message.
struct outcome {
  errc kind{};
  std::string what;
};

// Runs fn(comm) on `ranks` threads with the given communicator options and collects each
// rank's outcome instead of rethrowing.
template <class Fn>
std::vector<outcome> run_collect(int ranks, collective::communicator_options options, Fn fn) {
  transport::inproc_group group(ranks);
  auto raw = group.run([&](transport::inproc t) {
    collective::communicator comm(t, options);
    fn(comm);
  });
  std::vector<outcome> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    if (!raw[r]) continue;
    try {
      std::rethrow_exception(raw[r]);
    } catch (const error& e) {
      out[r] = {e.kind(), e.what()};
    } catch (const std::exception& e) {
      out[r] = {errc::config, e.what()};
    }
  }
  return out;
}

}  // namespace gradwire::test
