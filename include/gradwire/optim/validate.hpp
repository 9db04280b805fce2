// Hyperparameter checks shared by the optimizers: one clear error per bad value.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>

#include "../error.hpp"

namespace gradwire::optim::detail {

inline void require(bool ok, const char* optimizer, const char* name, double value, const char* rule) {
  if (!ok)
    throw error(errc::invalid_argument, std::string(optimizer) + ": " + name + " = " + std::to_string(value) +
                                            " is invalid; it must be " + rule);
}

inline void require_non_negative(const char* optimizer, const char* name, double value) {
  require(std::isfinite(value) && value >= 0.0, optimizer, name, value, ">= 0 and finite");
}

inline void require_unit_interval(const char* optimizer, const char* name, double value) {
  require(value >= 0.0 && value < 1.0, optimizer, name, value, "in [0, 1)");
}

inline void require_positive(const char* optimizer, const char* name, double value) {
  require(std::isfinite(value) && value > 0.0, optimizer, name, value, "> 0 and finite");
}

// Parameters, gradients and state must have one length.
inline void require_same_size(const char* optimizer, std::size_t params, std::size_t grads, std::size_t state) {
  if (params != grads || params != state)
    throw error(errc::invalid_argument, std::string(optimizer) + ": step over " + std::to_string(params) +
                                            " parameters with " + std::to_string(grads) +
                                            " gradients and state for " + std::to_string(state) +
                                            "; all three must match");
}

}  // namespace gradwire::optim::detail
