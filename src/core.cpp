// gradwire::gradwire's compiled runtime: the core's non-template code (topology, flat layouts,
// the collectives' check messages, the timeline's writer, the simulator's scheduler) and the
// float and double instantiations that strategies use (bucket schedules, the collectives over
// inproc), compiled once for every program that links it (config.hpp; docs/building.md).
// Header-only builds do not use this file.
#include <gradwire/config.hpp>
#if GRADWIRE_HEADER_ONLY
#error "src/core.cpp is the compiled runtime: build it with GRADWIRE_SEPARATE_COMPILATION (CMake does)"
#endif

#include <gradwire/collective/same_model.ipp>
#include <gradwire/collective/verify.ipp>
#include <gradwire/observe/timeline.ipp>
#include <gradwire/support/topology.ipp>
#include <gradwire/tensor/flat_layout.ipp>
#include <gradwire/transport/simulated/scheduler.ipp>

#include <gradwire/aggregation/detail/bucket_schedule.hpp>
#include <gradwire/instances/inproc.hpp>
#include <gradwire/training/finite_check.hpp>

namespace gradwire {
template class aggregation::detail::bucket_schedule<float>;
template class aggregation::detail::bucket_schedule<double>;
template std::optional<std::string> training::non_finite_report<float>(int, std::size_t, const shape&,
                                                                       std::span<const float>);
template std::optional<std::string> training::non_finite_report<double>(int, std::size_t, const shape&,
                                                                        std::span<const double>);
GRADWIRE_COLLECTIVE_INSTANCES(template, transport::inproc)
}  // namespace gradwire
