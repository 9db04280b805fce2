// GRADWIRE_LOG=info|debug: what a job does, as one line per event on stderr, prefixed by rank.
//
//   info   joining, roles, setup, lost peers, servers' summaries: a few lines per run
//   debug  also every step's stats and every collective: for finding where time goes
//
// Warnings (a rank waiting long for a stalled peer) are written at every level, even off.
//
// Unset, empty or "off": nothing. Lines are written whole (one write per line), so ranks
// that share a terminal do not interleave within a line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "../clock.hpp"

namespace gradwire::observe {

enum class log_level : int { warning = -1, off = 0, info = 1, debug = 2 };

namespace detail {
// An unknown value is not silently ignored: it says so once and logs at info.
inline log_level log_level_from(std::string_view value) {
  if (value.empty() || value == "off" || value == "0") return log_level::off;
  if (value == "info" || value == "1") return log_level::info;
  if (value == "debug" || value == "2") return log_level::debug;
  std::fprintf(stderr, "gradwire: GRADWIRE_LOG=%.*s is not one of off, info, debug; logging at info\n",
               static_cast<int>(value.size()), value.data());
  return log_level::info;
}

struct log_state {
  explicit log_state(const char* env) : level(static_cast<int>(log_level_from(env ? env : ""))) {}
  std::atomic<int> level;
  std::mutex mutex;  // one line at a time; guards sink
  std::FILE* sink = stderr;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

// Read once, on first use.
inline log_state& logger() {
  static log_state state(std::getenv("GRADWIRE_LOG"));
  return state;
}

inline void append(std::ostringstream&) {}
template <class First, class... Rest>
void append(std::ostringstream& out, First&& first, Rest&&... rest) {
  out << std::forward<First>(first);
  append(out, std::forward<Rest>(rest)...);
}
}  // namespace detail

// Whether lines of `level` are written: check it before building an expensive message.
inline bool log_enabled(log_level level) noexcept {
  return static_cast<int>(level) <= detail::logger().level.load(std::memory_order_relaxed);
}

// Overrides GRADWIRE_LOG for this process (tests, or a program's own --verbose flag).
inline void set_log_level(log_level level) noexcept {
  detail::logger().level.store(static_cast<int>(level), std::memory_order_relaxed);
}
// Where lines go (default stderr); the caller keeps `sink` open while logging is on.
inline void set_log_sink(std::FILE* sink) noexcept {
  auto& state = detail::logger();
  std::lock_guard lock(state.mutex);
  state.sink = sink ? sink : stderr;
}

// Writes "[gradwire R/N +T.TTTs] level: message" (rank R of N, seconds since the process
// first logged) when `level` is enabled; the parts are streamed into the message
// (floating-point parts with 3 decimals). `time`: the rank's (communicator::time()); on a
// simulated rank's virtual time, T is that time from the simulation's start, marked "virtual".
template <class... Parts>
void log(time_source time, log_level level, int rank, int size, Parts&&... parts) {
  if (!log_enabled(level)) return;
  auto& state = detail::logger();
  std::ostringstream line;
  virtual_time* const virtual_clock = time.virtual_clock();
  const double seconds =
      virtual_clock ? double(virtual_clock->now_ns()) / 1e9
                    : std::chrono::duration<double>(std::chrono::steady_clock::now() - state.start).count();
  char prefix[96];
  std::snprintf(prefix, sizeof prefix, "[gradwire %d/%d +%.3fs%s] %s: ", rank, size, seconds, virtual_clock ? " virtual" : "",
                level == log_level::debug ? "debug" : level == log_level::warning ? "warning" : "info");
  line << prefix;
  line.setf(std::ios::fixed);  // durations as 2.763 ms, not 2.76229 ms
  line.precision(3);
  detail::append(line, std::forward<Parts>(parts)...);
  line << '\n';
  const std::string text = std::move(line).str();
  std::lock_guard lock(state.mutex);
  std::fwrite(text.data(), 1, text.size(), state.sink);
  std::fflush(state.sink);
}

// On the steady clock: a real transport's own lines.
template <class... Parts>
void log(log_level level, int rank, int size, Parts&&... parts) {
  log(time_source{}, level, rank, size, std::forward<Parts>(parts)...);
}

template <class... Parts>
void log_info(int rank, int size, Parts&&... parts) {
  log(log_level::info, rank, size, std::forward<Parts>(parts)...);
}
// Always written, whatever GRADWIRE_LOG says: something a user must hear about.
template <class... Parts>
void log_warning(int rank, int size, Parts&&... parts) {
  log(log_level::warning, rank, size, std::forward<Parts>(parts)...);
}
template <class... Parts>
void log_debug(int rank, int size, Parts&&... parts) {
  log(log_level::debug, rank, size, std::forward<Parts>(parts)...);
}

}  // namespace gradwire::observe
