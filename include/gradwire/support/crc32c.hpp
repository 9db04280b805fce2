// CRC-32C (Castagnoli), the checksum of iSCSI and ext4: wire frames and checkpoint files use it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define GRADWIRE_HAS_CRC32C_INSTRUCTION 1
#endif

namespace gradwire::support {

namespace detail {

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0u);
    table[i] = c;
  }
  return table;
}();

inline std::uint32_t crc32c_portable(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    crc = crc32c_table[(crc ^ static_cast<std::uint8_t>(p[i])) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(GRADWIRE_HAS_CRC32C_INSTRUCTION)
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(std::uint32_t crc, const std::byte* p,
                                                                     std::size_t n) noexcept {
  std::uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, static_cast<std::uint8_t>(*p));
  return c32;
}
#endif

}  // namespace detail

// CRC-32C of `bytes`, continuing from `crc` (0 to start); the CPU's instruction where it
// has one (SSE4.2), a table otherwise: both give the same value.
inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
#if defined(GRADWIRE_HAS_CRC32C_INSTRUCTION)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return ~detail::crc32c_sse42(crc, bytes.data(), bytes.size());
#endif
  return ~detail::crc32c_portable(crc, bytes.data(), bytes.size());
}

}  // namespace gradwire::support
