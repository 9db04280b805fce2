// Fuzzes the parameter server's request and reply headers (ps/protocol.hpp): the
// decode_request a server runs on every request and the decode_reply a worker runs on
// every reply.
//
// Input: [mode][context][message bytes]. mode bit 0: 0 request, 1 reply. Context of a
// request: the server's version and update count (u64 each); of a reply: the version the
// pull asked for (u64) and the number of workers (u16).
// mode bit 1: instead of the message bytes, a request or reply that a real worker or
// server could send in that context is built from them, and it must be accepted (the
// checks must not refuse what gradwire itself sends).
// Properties: only errc::protocol rejects, naming the sender; what is accepted is what
// was sent, field by field.
#include <gradwire/ps/protocol.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"

namespace ps = gradwire::ps::detail;
using gradwire::errc;

namespace {

// x brought into 0..bound.
std::uint64_t at_most(std::uint64_t x, std::uint64_t bound) { return bound == ~0ull ? x : x % (bound + 1); }

void fuzz_request(gradwire::fuzz::input& in, bool legal) {
  const auto version = in.integer<std::uint64_t>(), updates = in.integer<std::uint64_t>();
  std::vector<std::byte> bytes;
  if (legal) {  // as ps::worker sends them (push, pull, done)
    ps::request_header h;
    const std::uint8_t kind = in.byte() % 3;
    const std::uint32_t flags = in.byte() & ps::in_window;
    const auto clock = in.integer<std::uint64_t>();
    if (kind == 0)
      h = {ps::request_kind::push, flags, at_most(in.integer<std::uint64_t>(), version), std::max<std::uint64_t>(clock, 1),
           at_most(in.integer<std::uint64_t>(), updates)};
    if (kind == 1)
      h = {ps::request_kind::pull, flags, at_most(in.integer<std::uint64_t>(), version == ~0ull ? version : version + 1),
           clock, 0};
    if (kind == 2) h = {ps::request_kind::done, 0, 0, clock, 0};
    const auto raw = ps::bytes_of(h);
    bytes.assign(raw.begin(), raw.end());
  } else {
    const auto raw = in.rest();
    bytes.assign(raw.begin(), raw.end());
  }
  try {
    const ps::request_header h = ps::decode_request(bytes, 5, 2, version, updates);
    GRADWIRE_FUZZ_CHECK(bytes.size() == sizeof h && std::memcmp(&h, bytes.data(), sizeof h) == 0,
                        "decode_request accepted a request that differs from its bytes");
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol}, "worker rank 2");
    GRADWIRE_FUZZ_CHECK(!legal, std::string("decode_request refused what a worker sends: ") + e.what());
  }
}

void fuzz_reply(gradwire::fuzz::input& in, bool legal) {
  const auto least = in.integer<std::uint64_t>();
  const int workers = in.integer<std::uint16_t>();
  std::vector<std::byte> bytes;
  if (legal) {  // as ps::server sends them, followed by the shard's parameters
    ps::reply_header h;
    h.version = least + std::min<std::uint64_t>(in.integer<std::uint32_t>(), ~0ull - least);
    h.updates = in.integer<std::uint64_t>();
    h.applied = in.integer<std::uint64_t>();
    h.staleness = at_most(in.integer<std::uint64_t>(), h.version);
    h.lost = workers == 0 ? 0 : in.integer<std::uint32_t>();
    h.last_lost = h.lost == 0 ? -1 : in.integer<std::uint16_t>() % workers;
    bytes.resize(sizeof h + in.byte() % 64 * 8);  // the parameters that follow the header
    std::memcpy(bytes.data(), &h, sizeof h);
  } else {
    const auto raw = in.rest();
    bytes.assign(raw.begin(), raw.end());
  }
  try {
    const ps::reply_header h = ps::decode_reply(bytes, 6, least, workers);
    GRADWIRE_FUZZ_CHECK(bytes.size() >= sizeof h && std::memcmp(&h, bytes.data(), sizeof h) == 0,
                        "decode_reply accepted a reply that differs from its bytes");
    GRADWIRE_FUZZ_CHECK(h.last_lost < workers && h.version >= least && h.staleness <= h.version,
                        "decode_reply accepted a reply outside its context");
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol}, "server rank 6");
    GRADWIRE_FUZZ_CHECK(!legal, std::string("decode_reply refused what a server sends: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t mode = in.byte();
  if (mode & 1) fuzz_reply(in, mode & 2);
  else fuzz_request(in, mode & 2);
  return 0;
}
