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
  const std::string text(reinterpret_cast<const char*>(data), size);
  gc::tf_config c;
  try {
    c = gc::parse_tf_config(text);
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::config}, "TF_CONFIG");
    return 0;
  }
  using gradwire::fuzz::finding;
  const int n = static_cast<int>(c.roles.size());
  if (n < 1 || c.task_addresses.size() != c.roles.size()) finding("a TF_CONFIG without one address per task");
  if (c.rank < 0 || c.rank >= n) finding("a TF_CONFIG task outside the cluster");
  if (c.local_world_size < 1 || c.local_rank < 0 || c.local_rank >= c.local_world_size || c.local_world_size > n)
    finding("a TF_CONFIG local rank or size out of range");
  if (c.master_port < 1 || c.master_port > 65535) finding("a TF_CONFIG master port outside 1..65535");
  if (std::count(c.roles.begin(), c.roles.end(), gc::task_type::chief) > 1) finding("a TF_CONFIG with two chiefs");
  if (!std::is_sorted(c.roles.begin(), c.roles.end(), [](gc::task_type a, gc::task_type b) {
        return static_cast<int>(a) < static_cast<int>(b);
      }))
    finding("TF_CONFIG roles not in rank order (chief, workers, ps)");
  return 0;
}
