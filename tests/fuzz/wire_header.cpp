// Fuzzes the wire frame header (support/wire.hpp): decode, check_payload, and the round trip.
//
// Input: [mode][48 header bytes][payload]. mode bit 0: write the right header CRC over
// bytes 0..43 first, bit 1: the right payload CRC into the header (before the header
// CRC), so that the fuzzer reaches the checks behind the checksums; without them it
// tests the checksums themselves.
// Properties: only errc::protocol / errc::auth reject, naming the sender; a header that
// decodes re-encodes to the same 48 bytes; a payload passes check_payload exactly when
// unchecksummed or its CRC-32C (the table implementation, as a reference) matches.
#include <gradwire/support/wire.hpp>

#include <array>
#include <cstring>

#include "fuzz_support.hpp"

namespace wire = gradwire::support::wire;
using gradwire::errc;

namespace {
const std::uint64_t job = wire::token_hash("fuzz-job");

std::uint32_t reference_crc(std::span<const std::byte> bytes) {
  return ~gradwire::support::detail::crc32c_portable(~0u, bytes.data(), bytes.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t mode = in.byte();
  auto frame = gradwire::fuzz::take_frame(in, mode, reference_crc);
  const auto& header = frame.header;
  const auto payload = frame.payload;
  const auto header_bytes = frame.given_header();
  wire::frame_header h;
  try {
    h = wire::decode(header_bytes, job, "rank 7");
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol, errc::auth}, "rank 7");
    return 0;
  }
  GRADWIRE_FUZZ_CHECK(wire::encode(h) == header, "a decoded header does not re-encode to the same bytes");
  if (payload.size() < h.length) return 0;  // the rest of the frame never came
  const auto body = payload.first(static_cast<std::size_t>(h.length));
  const bool intact = !(h.flags & wire::payload_checksummed) || reference_crc(body) == h.payload_crc;
  try {
    wire::check_payload(h, body, "rank 7");
    GRADWIRE_FUZZ_CHECK(intact, "check_payload accepted a payload whose CRC-32C differs from its header's");
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol}, "rank 7");
    GRADWIRE_FUZZ_CHECK(!intact, std::string("check_payload refused an intact payload: ") + e.what());
  }
  return 0;
}
