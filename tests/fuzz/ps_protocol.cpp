// Fuzzes the parameter server's wire headers (ps/protocol.hpp): the decode_request a
// server runs on every request, the decode_reply a worker runs on every reply, and the
// replication stream between a server and its standby: decode_replica_header (the
// standby, on every update) and decode_replica_ack (the server, on every acknowledgement).
//
// Input: [mode][context][message bytes]. mode bit 2 and bit 0 pick the message:
//   0: request; context: the server's version and update count (u64 each)
//   1: reply; context: the version the pull asked for (u64), the number of workers (u16)
//   4: replica header; context: the standby's version, update count and applied count (u64 each)
//   5: replica ack; context: the updates acknowledged and the updates sent (u64 each)
// mode bit 1: instead of the message bytes, a message that a real worker, server or
// standby could send in that context is built from them, and it must be accepted (the
// checks must not refuse what gradwire itself sends). With bit 3 too, a replica header
// so built then has one field set from the input (set_one_field), and may be refused.
// Properties: only errc::protocol rejects, naming the sender (both ranks for the replica
// messages); what is accepted is what was sent, field by field, within its context: an
// update is the standby's next, its counters do not go back and its factor is positive
// and finite; an acknowledgement is of an update sent and not yet acknowledged.
#include <gradwire/ps/protocol.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "fuzz_support.hpp"

namespace ps = gradwire::ps::detail;
using gradwire::errc;

namespace {

std::vector<std::byte> copy_of(std::span<const std::byte> bytes) { return {bytes.begin(), bytes.end()}; }

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
    bytes = copy_of(ps::bytes_of(h));
  } else {
    bytes = copy_of(in.rest());
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
    bytes = copy_of(in.rest());
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

// x + y, or the largest u64 when that overflows.
std::uint64_t plus(std::uint64_t x, std::uint64_t y) { return x + std::min(y, ~std::uint64_t{0} - x); }

// One field of `h` set from the input: the kind or reserved word to any value, a counter
// moved by -128..127, or the factor to an edge value or any bits (libFuzzer compares
// integers, not doubles, so it would seldom find 0, infinity or 1e300 in the bytes).
void set_one_field(gradwire::fuzz::input& in, ps::replica_header& h) {
  static constexpr double edges[] = {0.0, -0.0, -1.0, std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(),
                                     1e300, std::numeric_limits<double>::max(), 1.0};
  const std::uint8_t field = in.byte();
  auto move = [&](std::uint64_t& counter) { counter += static_cast<std::uint64_t>(in.integer<std::int8_t>()); };
  switch (field % 8) {
    case 0: h.kind = static_cast<ps::replica_kind>(in.integer<std::uint32_t>()); break;
    case 1: h.reserved = in.integer<std::uint32_t>(); break;
    case 2: {
      const std::uint8_t b = in.byte();
      h.scale = b < 128 ? edges[b % std::size(edges)] : std::bit_cast<double>(in.integer<std::uint64_t>());
      break;
    }
    case 3: move(h.version); break;
    case 4: move(h.updates); break;
    case 5: move(h.applied); break;
    case 6: move(h.next_version); break;
    case 7: move(h.next_applied); break;
  }
}

// The replica messages pass between server rank 3 and its standby rank 7: distinct, so
// that a rejection naming one for the other is caught.
void fuzz_replica_header(gradwire::fuzz::input& in, bool legal, bool one_field) {
  const auto version = in.integer<std::uint64_t>(), updates = in.integer<std::uint64_t>(),
             applied = in.integer<std::uint64_t>();
  std::vector<std::byte> bytes;
  if (legal) {  // as ps::server sends them: the counters before and after one update, or the end
    ps::replica_header h{ps::replica_kind::done};
    if (const std::uint8_t how = in.byte(); how % 8 != 0) {
      // Before: the standby's counters, which the server may have moved on since (async
      // modes advance the version when a worker finishes; sync modes count a step's
      // gradients as they arrive). After: a sync step adds a version; an async update adds
      // an applied gradient and perhaps a version (the slowest worker's clock).
      const bool sync = how & 8, in_float = how & 16;
      const auto n = std::max<std::uint32_t>(in.integer<std::uint32_t>(), 1);  // the step's gradients, or the lag
      h.kind = ps::replica_kind::update;
      h.scale = in_float ? static_cast<double>(1.0f / static_cast<float>(n)) : 1.0 / n;
      h.version = plus(version, in.integer<std::uint32_t>());
      h.updates = updates;
      h.applied = plus(applied, in.integer<std::uint32_t>());
      h.next_version = plus(h.version, sync || (how & 32) ? 1 : 0);
      h.next_applied = plus(h.applied, sync ? 0 : 1);
    }
    if (one_field) {  // then one field off: the fuzzer reaches each check from a header that passes the others
      legal = false;
      set_one_field(in, h);
    }
    bytes = copy_of(ps::bytes_of(h));
  } else {
    bytes = copy_of(in.rest());
  }
  try {
    const ps::replica_header h = ps::decode_replica_header(bytes, 7, 3, version, updates, applied);
    GRADWIRE_FUZZ_CHECK(bytes.size() == sizeof h && std::memcmp(&h, bytes.data(), sizeof h) == 0,
                        "decode_replica_header accepted a header that differs from its bytes");
    GRADWIRE_FUZZ_CHECK(h.kind == ps::replica_kind::update || h.kind == ps::replica_kind::done,
                        "decode_replica_header accepted an unknown kind " +
                            std::to_string(static_cast<std::uint32_t>(h.kind)));
    if (h.kind == ps::replica_kind::update) {
      GRADWIRE_FUZZ_CHECK(h.reserved == 0 && h.scale >= std::numeric_limits<float>::min() && h.scale <= 1,
                          "decode_replica_header accepted an update with the factor " + std::to_string(h.scale));
      GRADWIRE_FUZZ_CHECK(h.updates == updates, "decode_replica_header accepted update " +
                                                    std::to_string(h.updates + 1) + " after the standby's update " +
                                                    std::to_string(updates));
      GRADWIRE_FUZZ_CHECK(h.version >= version && h.applied >= applied && h.next_version >= h.version &&
                              h.next_applied >= h.applied,
                          "decode_replica_header accepted an update whose counters go back");
    } else {
      GRADWIRE_FUZZ_CHECK(h.reserved == 0 && h.scale == 0 && h.version == 0 && h.updates == 0 && h.applied == 0 &&
                              h.next_version == 0 && h.next_applied == 0,
                          "decode_replica_header accepted an end of updates with fields set");
    }
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol}, "standby rank 7");
    gradwire::fuzz::expect_error(e, {errc::protocol}, "server rank 3");
    GRADWIRE_FUZZ_CHECK(!legal, std::string("decode_replica_header refused what a server sends: ") + e.what());
  }
}

void fuzz_replica_ack(gradwire::fuzz::input& in, bool legal) {
  auto acked = in.integer<std::uint64_t>(), replicated = in.integer<std::uint64_t>();
  const auto version = in.integer<std::uint64_t>();  // what the next unacknowledged update took the server to
  std::vector<std::byte> bytes;
  if (legal) {  // as a standby sends them: its update count and version after the next update
    // The server waits for an acknowledgement only while some update is unacknowledged; a
    // standby acknowledges each in turn (acked + 1).
    acked = std::min(acked, ~std::uint64_t{0} - 1);
    replicated = std::max(replicated, acked + 1);
    const ps::replica_ack a{version, acked + 1};
    bytes = copy_of(ps::bytes_of(a));
  } else {
    bytes = copy_of(in.rest());
  }
  try {
    const ps::replica_ack a = ps::decode_replica_ack(bytes, 3, 7, acked, replicated, version);
    GRADWIRE_FUZZ_CHECK(bytes.size() == sizeof a && std::memcmp(&a, bytes.data(), sizeof a) == 0,
                        "decode_replica_ack accepted an acknowledgement that differs from its bytes");
    GRADWIRE_FUZZ_CHECK(a.updates == acked + 1 && a.updates <= replicated && a.version == version,
                        "decode_replica_ack accepted update " + std::to_string(a.updates) + " at version " +
                            std::to_string(a.version) + " after update " + std::to_string(acked) + " of " +
                            std::to_string(replicated) + " sent, the next at version " + std::to_string(version));
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::protocol}, "server rank 3");
    gradwire::fuzz::expect_error(e, {errc::protocol}, "standby rank 7");
    GRADWIRE_FUZZ_CHECK(!legal, std::string("decode_replica_ack refused what a standby sends: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input in(data, size);
  const std::uint8_t mode = in.byte();
  const bool legal = mode & 2;
  switch (mode & 5) {
    case 0: fuzz_request(in, legal); break;
    case 1: fuzz_reply(in, legal); break;
    case 4: fuzz_replica_header(in, legal, legal && (mode & 8)); break;
    case 5: fuzz_replica_ack(in, legal); break;
  }
  return 0;
}
