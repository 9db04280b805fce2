// Definitions of same_model.hpp: the messages that say how two ranks' models differ. Compiled once in
// src/core.cpp, or included by same_model.hpp in header-only mode (config.hpp).
#pragma once

#include <string>

#include "same_model.hpp"

namespace gradwire::collective::detail {

GRADWIRE_DECL std::string describe_layout(const decoded_layout& m) {
  std::string s = std::to_string(m.shapes.size()) + (m.shapes.size() == 1 ? " tensor of " : " tensors of ") +
                  name_of(m.type) + ", " + std::to_string(m.elements) + " elements";
  if (m.shapes.empty()) return s;
  s += ": ";
  for (std::size_t i = 0; i < m.shapes.size() && i < 8; ++i) s += (i ? ", " : "") + m.shapes[i].to_string();
  if (m.shapes.size() > 8) s += ", ... (" + std::to_string(m.shapes.size() - 8) + " more)";
  return s;
}

GRADWIRE_DECL std::string first_difference(const decoded_layout& a, int rank_a, const decoded_layout& b, int rank_b) {
  const std::string ra = "rank " + std::to_string(rank_a), rb = "rank " + std::to_string(rank_b);
  if (a.type != b.type) return std::string("dtype ") + name_of(a.type) + " on " + ra + ", " + name_of(b.type) + " on " + rb;
  for (std::size_t i = 0; i < std::min(a.shapes.size(), b.shapes.size()); ++i)
    if (!(a.shapes[i] == b.shapes[i]))
      return "tensor " + std::to_string(i) + " is " + a.shapes[i].to_string() + " on " + ra + ", " +
             b.shapes[i].to_string() + " on " + rb;
  return "tensor count " + std::to_string(a.shapes.size()) + " on " + ra + ", " + std::to_string(b.shapes.size()) +
         " on " + rb;
}

}  // namespace gradwire::collective::detail
