// Fuzzes Slurm's list formats (cluster/spec.hpp): host lists ("node[01-04,07],gpu-3",
// whose first host becomes MASTER_ADDR) and tasks-per-node lists ("2(x3),1").
//
// Input: [node i32][list text]. Both parsers read the text.
// Properties: the first host of a list without brackets is its text up to the first
// comma; a host never contains '[', ']' or ','; a node's task count is one of the counts
// the list names, and is found for node 0 of any list that parses to one at all.
#include <gradwire/cluster/spec.hpp>

#include <string>
#include <string_view>

#include "fuzz_support.hpp"

namespace gc = gradwire::cluster;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const int node = in.integer<std::int32_t>();
  const std::string list = in.rest_text();

  const std::string host = gc::detail::first_slurm_host(list);
  GRADWIRE_FUZZ_CHECK(list.find_first_of("[]") != std::string::npos || host == list.substr(0, list.find(',')),
                      "first_slurm_host of a list without brackets is not its first item");
  GRADWIRE_FUZZ_CHECK(host.find_first_of("[],") == std::string::npos, "first_slurm_host returned a bracket or a comma");

  const auto tasks = gc::detail::slurm_tasks_on_node(list, node);
  GRADWIRE_FUZZ_CHECK(!tasks || list.find(std::to_string(*tasks)) != std::string::npos,
                      "slurm_tasks_on_node returned a count the list does not name");
  GRADWIRE_FUZZ_CHECK(!tasks || gc::detail::slurm_tasks_on_node(list, 0),
                      "a tasks list that has node N but not node 0");
  return 0;
}
