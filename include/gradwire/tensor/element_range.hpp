// element_range: a contiguous run of a tensor's elements, [offset, offset + count).
#pragma once

#include <cstddef>

namespace gradwire {

struct element_range {
  std::size_t offset = 0;
  std::size_t count = 0;

  std::size_t end() const noexcept { return offset + count; }
  bool empty() const noexcept { return count == 0; }
  friend bool operator==(const element_range&, const element_range&) = default;
};

}  // namespace gradwire
