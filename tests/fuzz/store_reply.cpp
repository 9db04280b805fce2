// Fuzzes the rendezvous store client's reply parsing (rendezvous/framed_io.hpp,
// store.hpp): the header checks read_frame makes, the payload check, and what
// store_client::call makes of the reply; and, for a get's value, split_address, which
// the TCP join runs on the addresses ranks publish in the store.
//
// Input: [mode][48 header bytes][payload]; mode bit 0: the right header CRC, bit 1: the
// right payload CRC (see wire_header.cpp), bits 2..3: the request answered (1 set,
// 2 get, 3 add; 0 counts as get). A payload shorter than announced is skipped.
// Properties: only gradwire errors of the kinds documented reject, naming the store;
// an add's answer is 8 bytes, a set's empty.
#include <gradwire/rendezvous/store.hpp>
#include <gradwire/support/asio.hpp>

#include <array>
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"

namespace rz = gradwire::rendezvous::detail;
namespace wire = gradwire::support::wire;
using gradwire::errc;

namespace {
// Hashed once, as the client does.
const std::uint64_t job = wire::token_hash("fuzz-job");
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t mode = in.byte();
  const int op_bits = (mode >> 2) & 3;
  const auto op = op_bits == 0 ? rz::store_op::get : static_cast<rz::store_op>(op_bits);
  auto frame = gradwire::fuzz::take_frame(in, mode, [](auto bytes) { return wire::crc32c(bytes); });
  const auto payload = frame.payload;
  const std::string where = "the rendezvous store at 10.0.0.1:29500";
  std::vector<std::byte> value;
  try {
    const wire::frame_header h = rz::decode_control_header(frame.given_header(),
                                                           job, where, rz::max_store_value);
    if (payload.size() < h.length) return 0;
    const auto body = payload.first(static_cast<std::size_t>(h.length));
    wire::check_payload(h, body, where);
    value = rz::parse_store_reply(h, std::vector<std::byte>(body.begin(), body.end()), op, where);
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol, errc::auth}, where);
    return 0;
  }
  GRADWIRE_FUZZ_CHECK(op != rz::store_op::add || value.size() == 8, "an add answered without 8 bytes");
  GRADWIRE_FUZZ_CHECK(op != rz::store_op::set || value.empty(), "a set answered with a value");
  if (op == rz::store_op::get) {
    const std::string text(reinterpret_cast<const char*>(value.data()), value.size());
    try {
      const auto [host, port] = gradwire::support::split_address(text, "rank 3's address");
      GRADWIRE_FUZZ_CHECK(port != 0, "split_address returned port 0");
    } catch (const gradwire::error& e) {
      gradwire::fuzz::expect_error(e, {errc::config}, "rank 3's address");
    }
  }
  return 0;
}
