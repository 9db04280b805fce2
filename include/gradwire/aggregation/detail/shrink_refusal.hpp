// GRADWIRE_MIN_REPLICAS asks for a job that goes on past a lost replica: an aggregation that cannot shrink refuses
// it at setup, on every rank, rather than fail at the first loss.
#pragma once

#include <cstdlib>
#include <string>

#include "../../error.hpp"

namespace gradwire::aggregation::detail {

inline void refuse_min_replicas(const char* aggregation, const char* why) {
  const char* text = std::getenv("GRADWIRE_MIN_REPLICAS");
  if (text == nullptr || *text == '\0') return;
  throw error(errc::config, std::string("GRADWIRE_MIN_REPLICAS=") + text +
                                " asks for a job that goes on past a lost replica, but " + aggregation +
                                " cannot shrink (" + why +
                                "): use aggregation::elastic_all_reduce, or unset it (docs/elastic.md)");
}

}  // namespace gradwire::aggregation::detail
