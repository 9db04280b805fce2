// GRADWIRE_MIN_REPLICAS, the floor of an elastic job (docs/elastic.md): reading it, and the refusal of an
// aggregation that cannot shrink. Light: a program that only reads it includes nothing else.
#pragma once

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include "../error.hpp"

namespace gradwire::aggregation {

// GRADWIRE_MIN_REPLICAS, or `fallback` when unset; a value that is not a positive integer
// is refused.
inline int min_replicas_from_environment(int fallback = 1) {
  const char* text = std::getenv("GRADWIRE_MIN_REPLICAS");
  if (text == nullptr || *text == '\0') return fallback;
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || value < 1)
    throw error(errc::config, "GRADWIRE_MIN_REPLICAS=\"" + std::string(s) + "\": expected a positive integer");
  return value;
}

namespace detail {

// GRADWIRE_MIN_REPLICAS asks for a job that goes on past a lost replica: an aggregation that
// cannot shrink refuses it at setup, on every rank, rather than fail at the first loss.
inline void refuse_min_replicas(const char* aggregation, const char* why) {
  const char* text = std::getenv("GRADWIRE_MIN_REPLICAS");
  if (text == nullptr || *text == '\0') return;
  throw error(errc::config, std::string("GRADWIRE_MIN_REPLICAS=") + text +
                                " asks for a job that goes on past a lost replica, but " + aggregation +
                                " cannot shrink (" + why +
                                "): use aggregation::elastic_all_reduce, or unset it (docs/elastic.md)");
}

}  // namespace detail
}  // namespace gradwire::aggregation
