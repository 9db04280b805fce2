// Definitions of timeline.hpp: writing the trace. Compiled once in src/core.cpp, or included by timeline.hpp
// in header-only mode (config.hpp).
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include "timeline.hpp"

namespace gradwire::observe {

GRADWIRE_DECL bool timeline::write() {
  std::lock_guard lock(mutex_);
  if (path_.empty() || (events_.empty() && ranks_.empty())) return true;
  const std::string body = render();
  const bool ok = with_locked_file([&](int fd) { return merge(fd, body); });
  events_.clear();
  ranks_.clear();
  dropped_ = 0;
  touched_file_ = true;
  return ok;
}

GRADWIRE_DECL std::string timeline::render() const {
  std::string out;
  out.reserve(160 * (events_.size() + 3 * ranks_.size() + 1));
  char number[96];
  bool first = true;
  auto next = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& [rank, size] : ranks_) {
    const std::string pid = std::to_string(pid_of(rank, size));
    next();
    std::snprintf(number, sizeof number, "rank %d of %d", rank, size);
    out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"args\":{\"name\":";
    json_string(out, number);
    out += "}}";
    next();
    out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid + ",\"args\":{\"sort_index\":" + pid +
           "}}";
    for (int track = 0; track < 2; ++track) {
      next();
      out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
             ",\"tid\":" + std::to_string(track) + ",\"args\":{\"name\":" +
             (track == 0 ? "\"step\"" : "\"background collectives\"") + "}}";
    }
  }
  for (const auto& e : events_) {
    next();
    out += "{\"name\":";
    json_string(out, e.name);
    out += ",\"cat\":";
    json_string(out, e.category);
    // Microseconds with nanosecond decimals, without going through a double.
    std::snprintf(number, sizeof number, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld.%03lld,\"dur\":%lld.%03lld",
                  pid_of(e.rank, e.size), e.track, static_cast<long long>(e.begin_ns / 1000),
                  static_cast<long long>(e.begin_ns % 1000), static_cast<long long>(e.duration_ns / 1000),
                  static_cast<long long>(e.duration_ns % 1000));
    out += number;
    out += ",\"args\":{\"bytes\":" + std::to_string(e.bytes);
    for (const auto& a : e.args) {
      if (!a.key) continue;
      out += ',';
      json_string(out, a.key);
      out += ':';
      if (a.text)
        json_string(out, a.text);
      else
        out += std::to_string(a.number);
    }
    out += "}}";
  }
  if (dropped_ > 0) {
    next();
    out += "{\"name\":\"gradwire: events dropped (more than " + std::to_string(max_events) +
           " between writes)\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,\"ts\":0,\"args\":{\"dropped\":" +
           std::to_string(dropped_) + "}}";
  }
  return out;
}
GRADWIRE_DECL void trace_scope::log_line() const {
  std::string args;
  for (const auto& a : event_.args)
    if (a.key) args += std::string(" ") + a.key + "=" + (a.text ? std::string(a.text) : std::to_string(a.number));
  log(time_, log_level::debug, event_.rank, event_.size, event_.name, ": ", event_.bytes, " B in ",
      static_cast<double>(event_.duration_ns) / 1e3, " us", args);
}

}  // namespace gradwire::observe
