// Fuzzes TF_CONFIG parsing (cluster/tf_config.hpp): the input is the variable's text.
// Properties: only errc::config rejects, naming TF_CONFIG; what is accepted has one role
// and one "host:port" per task, the chief (if any) first, this task's rank and local rank
// in range, and the master's port in 1..65535.
#include <gradwire/cluster/tf_config.hpp>

#include <algorithm>
#include <string>

#include "fuzz_support.hpp"

namespace gc = gradwire::cluster;
using gradwire::errc;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto c = gradwire::fuzz::parse_text(data, size, gc::parse_tf_config, {errc::config}, "TF_CONFIG");
  if (!c) return 0;
  const int n = static_cast<int>(c->roles.size());
  GRADWIRE_FUZZ_CHECK(n >= 1 && c->task_addresses.size() == c->roles.size(),
                      "a TF_CONFIG without one address per task");
  GRADWIRE_FUZZ_CHECK(c->rank >= 0 && c->rank < n, "a TF_CONFIG task outside the cluster");
  GRADWIRE_FUZZ_CHECK(c->local_world_size >= 1 && c->local_rank >= 0 && c->local_rank < c->local_world_size &&
                          c->local_world_size <= n,
                      "a TF_CONFIG local rank or size out of range");
  GRADWIRE_FUZZ_CHECK(c->master_port >= 1 && c->master_port <= 65535, "a TF_CONFIG master port outside 1..65535");
  GRADWIRE_FUZZ_CHECK(std::count(c->roles.begin(), c->roles.end(), gc::task_type::chief) <= 1,
                      "a TF_CONFIG with two chiefs");
  GRADWIRE_FUZZ_CHECK(std::is_sorted(c->roles.begin(), c->roles.end(),
                                     [](gc::task_type a, gc::task_type b) {
                                       return static_cast<int>(a) < static_cast<int>(b);
                                     }),
                      "TF_CONFIG roles not in rank order (chief, workers, ps)");
  return 0;
}
