// The optional check for NaN and infinite gradients (strategy::check_finite_gradients): its switch, its report, and what a rank does on finding one.
//
// Off by default: a step then hands gradients on unread. On, each gradient is scanned
// once (kernels::first_non_finite, one vectorised pass; its cost is measured by
// benchmarks/finite_check) before it is communicated or accumulated. A rank that finds
// one fails its transport with the report (transport::fail, where the transport can), so
// the other ranks learn it from their next wait on this rank, as errc::peer_lost naming
// this rank and carrying the report, instead of waiting for a gradient that never
// comes, and then throws errc::invalid_argument.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "../collective/communicator.hpp"
#include "../concepts.hpp"
#include "../config.hpp"
#include "../error.hpp"
#include "../kernels/host.hpp"
#include "../tensor/shape.hpp"

namespace gradwire::training {

// GRADWIRE_CHECK_FINITE=1 turns the check on for every strategy built afterwards, 0 (or
// unset) leaves it off; anything else is a config error naming the variable.
inline bool finite_check_from_env() {
  const char* text = std::getenv("GRADWIRE_CHECK_FINITE");
  if (!text || !*text || std::string(text) == "0") return false;
  if (std::string(text) == "1") return true;
  throw error(errc::config, std::string("GRADWIRE_CHECK_FINITE='") + text +
                                "' is neither 0 nor 1 (1 checks every gradient for NaN and infinity at each step)");
}

// Nothing when every element of gradient `index` is finite; else what a step reports.
template <class V>
std::optional<std::string> non_finite_report(int rank, std::size_t index, const shape& of, std::span<const V> grad) {
  const std::size_t at = kernels::first_non_finite(grad.data(), grad.size());
  if (at == grad.size()) return std::nullopt;
  const V x = grad[at];
  const char* what = std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  return "strategy::step on rank " + std::to_string(rank) + ": gradient " + std::to_string(index) +
         " (parameter of shape " + of.to_string() + ") holds " + what + " at element " + std::to_string(at) + " of " +
         std::to_string(grad.size()) +
         " (GRADWIRE_CHECK_FINITE / check_finite_gradients): the loss or the model diverged on this rank; lower the "
         "learning rate, clip gradients, or look for a log(0) or 0/0 in the loss, then resume from a checkpoint";
}

#if !GRADWIRE_HEADER_ONLY  // compiled once, in src/core.cpp (config.hpp)
extern template std::optional<std::string> non_finite_report<float>(int, std::size_t, const shape&, std::span<const float>);
extern template std::optional<std::string> non_finite_report<double>(int, std::size_t, const shape&,
                                                                     std::span<const double>);
#endif

// Gradient i, of a parameter of shape `of`: a NaN or infinity in it? Then tell the other
// ranks (they would wait for it) and throw. This rank's transport is failed from here on.
template <class Transport, class V>
void check_finite(collective::communicator<Transport>& comm, std::size_t i, const shape& of, std::span<const V> grad) {
  const auto report = non_finite_report(comm.rank(), i, of, grad);
  if (!report) return;
  if constexpr (concepts::failable_transport<Transport>)
    if (comm.size() > 1) comm.transport().fail(errc::invalid_argument, *report);
  throw error(errc::invalid_argument, *report);
}

}  // namespace gradwire::training
