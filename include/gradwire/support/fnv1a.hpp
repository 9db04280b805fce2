// FNV-1a, 64 bits: a hash that is the same in every process, compiler and run (std::hash is none of these).
//
// Job ids become ports with it (cluster/spec.ipp), and a replica's final parameters become
// one line that scripts compare across ranks (examples/fashion_mnist). Not a checksum
// against corruption (support/crc32c.hpp is) and not for adversaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace gradwire::support {

// Fed in pieces, it gives the hash of their concatenation: a model is hashed tensor by tensor.
class fnv1a {
 public:
  constexpr fnv1a& add(std::span<const std::byte> bytes) noexcept {
    for (std::byte b : bytes) value_ = (value_ ^ std::to_integer<std::uint64_t>(b)) * prime;
    return *this;
  }
  constexpr fnv1a& add(std::string_view text) noexcept {
    for (char c : text) value_ = (value_ ^ static_cast<unsigned char>(c)) * prime;
    return *this;
  }
  constexpr std::uint64_t value() const noexcept { return value_; }

 private:
  static constexpr std::uint64_t offset_basis = 14695981039346656037ull;
  static constexpr std::uint64_t prime = 1099511628211ull;
  std::uint64_t value_ = offset_basis;
};

constexpr std::uint64_t fnv1a_of(std::string_view text) noexcept { return fnv1a().add(text).value(); }

}  // namespace gradwire::support
