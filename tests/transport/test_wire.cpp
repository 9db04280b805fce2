// Frame header encoding and the decoder's defences: round trips, every check, and random and truncated input.
#include <catch2/catch.hpp>

#include "helpers/errors.hpp"

#include <cstring>
#include <gradwire/support/fnv1a.hpp>
#include <gradwire/support/wire.hpp>
#include <random>
#include <string>
#include <vector>

namespace gw = gradwire;
namespace wire = gradwire::support::wire;

namespace {
const std::uint64_t token = wire::token_hash("job-1234");

wire::frame_header sample() {
  wire::frame_header h;
  h.kind = wire::frame_kind::data;
  h.dtype = 0;
  h.tag = 0x0123456789abcdefull;
  h.length = 1000003;
  h.source = 7;
  h.token_hash = token;
  return h;
}

using gradwire::testing::error_of;

// Re-seals a tampered header so that only the field under test is wrong.
void reseal(wire::header_bytes& b) {
  const std::uint32_t crc = wire::crc32c(std::span<const std::byte>(b.data(), 44));
  std::memcpy(b.data() + 44, &crc, 4);
}
}  // namespace

TEST_CASE("CRC-32C matches the published check value and the portable table") {
  const std::string check = "123456789";
  const auto bytes = std::as_bytes(std::span(check.data(), check.size()));
  REQUIRE(wire::crc32c(bytes) == 0xe3069283u);  // RFC 3720's check value
  REQUIRE(~wire::detail::crc32c_portable(~0u, bytes.data(), bytes.size()) == 0xe3069283u);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  REQUIRE(wire::crc32c(bytes.subspan(4), wire::crc32c(bytes.first(4))) == 0xe3069283u);
  std::mt19937 gen(std::random_device{}());
  std::vector<std::byte> data(1000 + gen() % 1000);
  for (auto& x : data) x = std::byte(gen());
  REQUIRE(wire::crc32c(data) == ~wire::detail::crc32c_portable(~0u, data.data(), data.size()));
}

TEST_CASE("FNV-1a matches the published test vectors, fed whole or in pieces") {
  // The FNV authors' 64-bit FNV-1a vectors (isthe.com/chongo/tech/comp/fnv).
  REQUIRE(gradwire::support::fnv1a_of("") == 0xcbf29ce484222325ull);
  REQUIRE(gradwire::support::fnv1a_of("a") == 0xaf63dc4c8601ec8cull);
  REQUIRE(gradwire::support::fnv1a_of("foobar") == 0x85944171f73967e8ull);
  // Bytes and text hash alike, and pieces hash as their concatenation (a model, tensor by tensor).
  const std::string text = "foobar";
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  gradwire::support::fnv1a pieces;
  pieces.add(bytes.first(2)).add(bytes.subspan(2, 3)).add(std::string_view(text).substr(5));
  REQUIRE(pieces.value() == 0x85944171f73967e8ull);
  // Every byte counts: one bit flipped anywhere changes the hash.
  std::vector<std::byte> data(64, std::byte{0x5a});
  const std::uint64_t whole = gradwire::support::fnv1a().add(data).value();
  for (std::size_t i = 0; i < data.size(); ++i) {
    auto flipped = data;
    flipped[i] ^= std::byte{1};
    REQUIRE(gradwire::support::fnv1a().add(flipped).value() != whole);
  }
}

TEST_CASE("a frame header round-trips every field") {
  auto h = sample();
  h.flags = wire::payload_checksummed;
  h.payload_crc = 0xdeadbeef;
  const auto d = wire::decode(wire::encode(h), token, "rank 7");
  REQUIRE(d.kind == h.kind);
  REQUIRE(d.dtype == h.dtype);
  REQUIRE(d.flags == h.flags);
  REQUIRE(d.payload_crc == h.payload_crc);
  REQUIRE(d.token_hash == h.token_hash);
  REQUIRE(d.tag == h.tag);
  REQUIRE(d.length == h.length);
  REQUIRE(d.source == h.source);
}

TEST_CASE("the decoder refuses each kind of bad header with a message that says which") {
  auto encoded = wire::encode(sample());
  SECTION("truncated") {
    auto [kind, what] = error_of([&] { wire::decode(std::span(encoded).first(47), token, "rank 2"); });
    REQUIRE(kind == gw::errc::protocol);
    REQUIRE_THAT(what, Catch::Contains("truncated") && Catch::Contains("47 of 48") && Catch::Contains("rank 2"));
  }
  SECTION("another protocol on the port") {
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n..........................";
    auto [kind, what] = error_of([&] { wire::decode(std::as_bytes(std::span(http.data(), 48)), token); });
    REQUIRE(kind == gw::errc::protocol);
    REQUIRE_THAT(what, Catch::Contains("not a gradwire frame"));
  }
  SECTION("another protocol version") {
    const auto other = static_cast<std::uint16_t>(wire::protocol_version + 1);
    std::memcpy(encoded.data() + 4, &other, sizeof other);  // the header is little-endian, as is this machine
    reseal(encoded);
    auto [kind, what] = error_of([&] { wire::decode(encoded, token); });
    REQUIRE(kind == gw::errc::protocol);
    REQUIRE_THAT(what, Catch::Contains("version " + std::to_string(other)) &&
                           Catch::Contains("speaks " + std::to_string(wire::protocol_version)));
  }
  SECTION("a flipped bit anywhere in the header") {
    std::mt19937 gen(std::random_device{}());
    const std::size_t at = 8 + gen() % 40;  // past magic and version, so the checksum is what catches it
    encoded[at] ^= std::byte(1u << (gen() % 8));
    CAPTURE(at);
    auto [kind, what] = error_of([&] { wire::decode(encoded, token); });
    REQUIRE(kind == gw::errc::protocol);
    REQUIRE_THAT(what, Catch::Contains("corrupt frame header"));
  }
  SECTION("an unknown kind") {
    encoded[6] = std::byte{200};
    reseal(encoded);
    REQUIRE_THAT(error_of([&] { wire::decode(encoded, token); }).second, Catch::Contains("unknown kind 200"));
  }
  SECTION("reserved bits") {
    encoded[10] = std::byte{1};
    reseal(encoded);
    REQUIRE_THAT(error_of([&] { wire::decode(encoded, token); }).second, Catch::Contains("reserved"));
  }
  SECTION("an absurd length") {
    auto h = sample();
    h.length = wire::max_payload + 1;
    auto [kind, what] = error_of([&] { wire::decode(wire::encode(h), token); });
    REQUIRE(kind == gw::errc::protocol);
    REQUIRE_THAT(what, Catch::Contains("limit"));
  }
  SECTION("another job's token") {
    auto [kind, what] = error_of([&] { wire::decode(encoded, wire::token_hash("job-9999"), "rank 1"); });
    REQUIRE(kind == gw::errc::auth);
    REQUIRE_THAT(what, Catch::Contains("GRADWIRE_JOB_TOKEN") && Catch::Contains("rank 1"));
  }
}

TEST_CASE("the decoder survives random and truncated input: an error or a valid header, never a crash") {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  std::size_t accepted = 0, refused = 0;
  std::vector<std::byte> buffer(2 * wire::header_size);
  for (int i = 0; i < 200000; ++i) {
    const std::size_t size = gen() % buffer.size();
    if (i % 4 == 0) {
      // A valid header, truncated or mutated in a few bytes: close to the real thing.
      auto encoded = wire::encode(sample());
      std::memcpy(buffer.data(), encoded.data(), encoded.size());
      for (int k = static_cast<int>(gen() % 3); k > 0; --k) buffer[gen() % wire::header_size] = std::byte(gen());
    } else {
      for (auto& x : buffer) x = std::byte(gen());
    }
    try {
      const auto h = wire::decode(std::span<const std::byte>(buffer.data(), size), token);
      // Anything accepted is a well-formed header of this job.
      REQUIRE(h.length <= wire::max_payload);
      REQUIRE(size >= wire::header_size);
      ++accepted;
    } catch (const gw::error& e) {
      REQUIRE((e.kind() == gw::errc::protocol || e.kind() == gw::errc::auth));
      ++refused;
    }
  }
  REQUIRE(refused > 0);
  REQUIRE(accepted > 0);  // the untouched valid headers among the mutated ones
}

TEST_CASE("a payload checksum catches a corrupted payload") {
  std::vector<std::byte> payload(4099);
  std::mt19937 gen(std::random_device{}());
  for (auto& x : payload) x = std::byte(gen());
  auto h = sample();
  h.length = payload.size();
  h.flags = wire::payload_checksummed;
  h.payload_crc = wire::crc32c(payload);
  REQUIRE_NOTHROW(wire::check_payload(h, payload));
  payload[gen() % payload.size()] ^= std::byte{0x10};
  REQUIRE_THROWS_WITH(wire::check_payload(h, payload, "rank 3"),
                      Catch::Contains("corrupt payload from rank 3"));
  h.flags = 0;  // no checksum sent: nothing to check
  REQUIRE_NOTHROW(wire::check_payload(h, payload));
}
