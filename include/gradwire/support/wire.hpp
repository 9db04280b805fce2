// Framing of byte streams: a fixed 48-byte frame header and its checks (tcp transport and rendezvous store).
//
// Every frame on a stream is a header followed by `length` payload bytes. The header
// carries what a receiver needs to reject anything that is not a frame of this job
// before it trusts a single length field: a magic number, the protocol version, the
// job token's hash, and a CRC-32C of the header itself. The payload's CRC is optional
// (flag `payload_checksummed`): TCP already checksums its segments, and a CRC costs a
// pass over every byte on both ends, so it is off unless asked for.
//
// Layout (little-endian):
//    0 magic u32       4 version u16     6 kind u8     7 dtype u8
//    8 flags u16      10 reserved u16   12 payload_crc u32
//   16 token_hash u64 24 tag u64        32 length u64
//   40 source u32     44 header_crc u32 (CRC-32C of bytes 0..43)
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"
#include "crc32c.hpp"

namespace gradwire::support::wire {

inline constexpr std::uint32_t magic = 0x46525747;  // "GWRF" in memory order
// 2: status frames (a rank that has waited long says what for; see asio_tcp's stall watch).
inline constexpr std::uint16_t protocol_version = 2;
inline constexpr std::size_t header_size = 48;
// A bound on one frame's payload, far above any message gradwire sends, so that a
// corrupt length is refused before anything is allocated or read for it.
inline constexpr std::uint64_t max_payload = std::uint64_t{1} << 40;

enum class frame_kind : std::uint8_t {
  hello = 1,      // connector -> acceptor: who I am (payload: hello_payload)
  welcome,        // acceptor -> connector: accepted
  refuse,         // acceptor -> connector: refused (payload: the reason, text)
  data,           // a tagged message of the transport
  abort,          // the sender failed or saw a failure; tag = errc | (1 + the rank it lost) << 32, payload = the reason
  store_request,  // rendezvous store: tag = request kind, payload = key/value
  store_reply,    // rendezvous store: tag = status
  goodbye,        // the sender closes its end in good order: no more frames follow
  status,         // the sender has waited long: tag = its operation number, payload = status_payload
};
inline constexpr std::uint8_t last_kind = static_cast<std::uint8_t>(frame_kind::status);

inline constexpr std::uint8_t raw_bytes = 0xff;  // dtype byte of untyped payloads

enum frame_flags : std::uint16_t { payload_checksummed = 1 };

struct frame_header {
  frame_kind kind = frame_kind::data;
  std::uint8_t dtype = raw_bytes;
  std::uint16_t flags = 0;
  std::uint32_t payload_crc = 0;
  std::uint64_t token_hash = 0;
  std::uint64_t tag = 0;
  std::uint64_t length = 0;
  std::uint32_t source = 0;  // the sender's rank
};

using header_bytes = std::array<std::byte, header_size>;

// CRC-32C lives in crc32c.hpp (checkpoints use it too); frames name it here.
using support::crc32c;
namespace detail {
using support::detail::crc32c_portable;
}  // namespace detail

// --- the job token -----------------------------------------------------------------

// What frames carry instead of the token itself: FNV-1a, then a 64-bit finaliser so
// that similar tokens give unrelated hashes. It tells jobs apart; it is not a MAC.
inline std::uint64_t token_hash(std::string_view token) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : token) h = (h ^ static_cast<std::uint8_t>(c)) * 0x100000001b3ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// --- encoding and decoding -----------------------------------------------------------

namespace detail {
template <class T>
T to_little(T value) noexcept {  // std::byteswap is C++23
  if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
    auto bytes = std::bit_cast<std::array<std::byte, sizeof(T)>>(value);
    for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(bytes[i], bytes[sizeof(T) - 1 - i]);
    value = std::bit_cast<T>(bytes);
  }
  return value;
}
template <class T>
void put(std::byte* at, T value) noexcept {
  value = to_little(value);
  std::memcpy(at, &value, sizeof(T));
}
template <class T>
T get(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return to_little(value);
}

inline std::string hex(std::uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}
}  // namespace detail

inline header_bytes encode(const frame_header& h) noexcept {
  header_bytes out{};
  std::byte* b = out.data();
  detail::put<std::uint32_t>(b + 0, magic);
  detail::put<std::uint16_t>(b + 4, protocol_version);
  detail::put<std::uint8_t>(b + 6, static_cast<std::uint8_t>(h.kind));
  detail::put<std::uint8_t>(b + 7, h.dtype);
  detail::put<std::uint16_t>(b + 8, h.flags);
  detail::put<std::uint16_t>(b + 10, 0);
  detail::put<std::uint32_t>(b + 12, h.payload_crc);
  detail::put<std::uint64_t>(b + 16, h.token_hash);
  detail::put<std::uint64_t>(b + 24, h.tag);
  detail::put<std::uint64_t>(b + 32, h.length);
  detail::put<std::uint32_t>(b + 40, h.source);
  detail::put<std::uint32_t>(b + 44, crc32c(std::span<const std::byte>(b, 44)));
  return out;
}

// Parses and checks a header received from `who` (named in messages, e.g. "rank 3").
// Anything but a well-formed header of this protocol version is errc::protocol; a
// well-formed header of another job (token hash differs) is errc::auth. Never reads
// outside `bytes`.
inline frame_header decode(std::span<const std::byte> bytes, std::uint64_t expected_token_hash,
                           std::string_view who = "peer") {
  const std::string from = " from " + std::string(who);
  if (bytes.size() < header_size)
    throw error(errc::protocol, "truncated frame header" + from + ": " + std::to_string(bytes.size()) + " of " +
                                    std::to_string(header_size) + " bytes");
  const std::byte* b = bytes.data();
  const auto m = detail::get<std::uint32_t>(b + 0);
  if (m != magic)
    throw error(errc::protocol, "not a gradwire frame" + from + " (magic " + detail::hex(m) + ", expected " +
                                    detail::hex(magic) + "): is another program talking to this port?");
  const auto version = detail::get<std::uint16_t>(b + 4);
  if (version != protocol_version)
    throw error(errc::protocol, "frame" + from + " speaks gradwire protocol version " + std::to_string(version) +
                                    ", this build speaks " + std::to_string(protocol_version) +
                                    ": run the same gradwire version on every rank");
  const auto crc = detail::get<std::uint32_t>(b + 44);
  if (crc != crc32c(bytes.first(44)))
    throw error(errc::protocol, "corrupt frame header" + from + " (header checksum " + detail::hex(crc) +
                                    " does not match its contents)");
  frame_header h;
  const auto kind = detail::get<std::uint8_t>(b + 6);
  if (kind == 0 || kind > last_kind)
    throw error(errc::protocol, "frame" + from + " has unknown kind " + std::to_string(kind));
  h.kind = static_cast<frame_kind>(kind);
  h.dtype = detail::get<std::uint8_t>(b + 7);
  h.flags = detail::get<std::uint16_t>(b + 8);
  if (detail::get<std::uint16_t>(b + 10) != 0 || (h.flags & ~std::uint16_t{payload_checksummed}) != 0)
    throw error(errc::protocol, "frame" + from + " sets reserved bits");
  h.payload_crc = detail::get<std::uint32_t>(b + 12);
  h.token_hash = detail::get<std::uint64_t>(b + 16);
  h.tag = detail::get<std::uint64_t>(b + 24);
  h.length = detail::get<std::uint64_t>(b + 32);
  h.source = detail::get<std::uint32_t>(b + 40);
  if (h.length > max_payload)
    throw error(errc::protocol, "frame" + from + " announces " + std::to_string(h.length) +
                                    " payload bytes, more than the limit of " + std::to_string(max_payload));
  if (h.token_hash != expected_token_hash)
    throw error(errc::auth, "frame" + from +
                                " belongs to another job (job token hash differs): give every rank the same "
                                "GRADWIRE_JOB_TOKEN");
  return h;
}

// What a payload whose CRC (`got`) is not its header's says; one wording for check_payload
// and for receives that compute the CRC as the bytes land.
inline std::string corrupt_payload_message(const frame_header& h, std::uint32_t got, std::string_view who) {
  return "corrupt payload from " + std::string(who) + " (tag " + std::to_string(h.tag) + ", " +
         std::to_string(h.length) + " bytes): checksum " + detail::hex(got) + ", header says " +
         detail::hex(h.payload_crc);
}

// Checks a received payload against its header's CRC, when the sender computed one.
inline void check_payload(const frame_header& h, std::span<const std::byte> payload, std::string_view who = "peer") {
  if (!(h.flags & payload_checksummed)) return;
  const std::uint32_t got = crc32c(payload);
  if (got != h.payload_crc) throw error(errc::protocol, corrupt_payload_message(h, got, who));
}

}  // namespace gradwire::support::wire
