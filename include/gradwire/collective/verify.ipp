// Definitions of verify.hpp: a collective call described in words. Compiled once in src/core.cpp, or
// included by verify.hpp in header-only mode (config.hpp).
#pragma once

#include <string>

#include "verify.hpp"

namespace gradwire::collective {

GRADWIRE_DECL std::string call_descriptor::to_string() const {
  std::string s = std::string(name_of(op)) + "(count=" + std::to_string(count) + ", dtype=" + name_of(type);
  if (op == operation::all_reduce || op == operation::reduce_scatter)
    s += std::string(", op=") + name_of(static_cast<reduce_op>(argument));
  if (op == operation::broadcast) s += ", root=" + std::to_string(argument);
  s += ")";
  if (algorithm != algorithm_id::none) s += std::string(" by ") + name_of(algorithm);
  if (segments > 1) s += " in " + std::to_string(segments) + " segments";
  return s;
}

}  // namespace gradwire::collective
