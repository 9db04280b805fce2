// Fuzzes the rendezvous store server's request parsing (rendezvous/store.hpp): the
// header checks it makes before reading a payload and the payload's parse, the very
// functions store_server::session calls.
//
// Input: [mode][48 header bytes][payload]; mode bit 0: the right header CRC, bit 1: the
// right payload CRC (see wire_header.cpp). A payload shorter than the header announces
// is a frame whose rest never came (the server would still be reading): skipped.
// Properties: only errc::protocol / errc::auth reject, naming the client; a parsed
// request packs back to its payload; an add carries 8 bytes.
#include <gradwire/rendezvous/store.hpp>

#include <algorithm>
#include <array>
#include <cstring>

#include "fuzz_support.hpp"

namespace rz = gradwire::rendezvous::detail;
namespace wire = gradwire::support::wire;
using gradwire::errc;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t mode = in.byte();
  auto frame = gradwire::fuzz::take_frame(in, mode, [](auto bytes) { return wire::crc32c(bytes); });
  const auto payload = frame.payload;
  const std::string_view who = "client 10.0.0.7";
  try {
    const wire::frame_header h =
        rz::decode_store_request_header(frame.given_header(), wire::token_hash("fuzz-job"), who);
    if (payload.size() < h.length) return 0;
    const auto body = payload.first(static_cast<std::size_t>(h.length));
    const rz::store_request r = rz::parse_store_request(h, body, who);
    const auto packed = rz::pack(r.key, r.value);
    GRADWIRE_FUZZ_CHECK(std::equal(packed.begin(), packed.end(), body.begin(), body.end()),
                        "a parsed store request does not pack back to its payload");
    GRADWIRE_FUZZ_CHECK(r.op != rz::store_op::add || r.value.size() == 8, "an add without an 8-byte value");
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol, errc::auth}, who);
  }
  return 0;
}
