// Fuzzes the simulator's cluster description (transport/simulated/cluster_model.hpp): the input is
// the text parse_cluster_model reads ("hosts=4 ranks_per_host=2 bandwidth=10Gbit ...").
// Properties: only errc::config rejects; what is accepted validates, and describe()
// reads back (parse_cluster_model) to a model that describes the same.
#include <gradwire/transport/simulated/cluster_model.hpp>

#include <string>

#include "fuzz_support.hpp"

namespace sim = gradwire::simulation;
using gradwire::errc;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto m = gradwire::fuzz::parse_text(
      data, size, [](const std::string& text) { return sim::parse_cluster_model(text); }, {errc::config},
      "simulated cluster");
  if (!m) return 0;
  const std::string described = sim::describe(*m);
  try {
    const sim::cluster_model again = sim::parse_cluster_model(described);
    GRADWIRE_FUZZ_CHECK(sim::describe(again) == described,
                        "describe() does not read back to the same model: " + described);
  } catch (const gradwire::error& e) {
    gradwire::fuzz::finding("describe() of an accepted model does not parse: " + described + ": " + e.what());
  }
  return 0;
}
