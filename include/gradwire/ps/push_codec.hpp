// A parameter-server push through a codec: the payload's layout, a codec state per shard piece on the worker, the server's decode.
//
// With a codec (aggregation::parameter_server<Mode, Codec>), a worker's push to a server is
// the payload of each of that server's pieces (sharding.hpp), one after another, each made
// by the codec's single encode from that piece's own state: error feedback's residual and
// PowerSGD's Q live on the worker, one per piece, and a piece is the same elements every
// step, so the state follows the same values. The server decodes each piece before it
// applies (async modes) or sums (sync modes) it, so its update, what its standby mirrors and
// its checkpoints are in V as without a codec; pulls carry parameters in V. A piece's payload
// is encoded_bytes<V>(its size), a function of the size alone, so both sides lay a push out
// alike; push_fingerprint is what setup checks every rank agrees on.
// Only instantiated with a codec: without one (aggregation::no_codec) the worker and the
// server compile none of this (if constexpr), and the push is the gathered pieces in V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../tensor/aligned_buffer.hpp"
#include "sharding.hpp"

namespace gradwire::ps::detail {

// How messages name a codec: its `name` where it has one (the library's codecs do).
template <class Codec>
std::string codec_name() {
  if constexpr (requires { Codec::name; })
    return std::string("'") + Codec::name + "'";
  else
    return "(a codec without a name)";
}

// Where each piece's payload starts in a push of `pieces` (a server's shard, in order):
// piece k is bytes [at[k], at[k + 1]); at.back() is the push's size.
template <class V, class Codec>
std::vector<std::size_t> payload_offsets(const Codec& codec, std::span<const piece> pieces) {
  std::vector<std::size_t> at(pieces.size() + 1, 0);
  for (std::size_t k = 0; k < pieces.size(); ++k) at[k + 1] = at[k] + codec.template encoded_bytes<V>(pieces[k].size());
  return at;
}

// What every rank must agree on for a push to decode as it was encoded: the codec's and the
// value's types (as this build spells them) and each server's payload size. FNV-1a, 64 bits.
template <class V, class Codec>
std::uint64_t push_fingerprint(const Codec& codec, const sharding& shards) {
  std::uint64_t h = 0xcbf2'9ce4'8422'2325ull;
  auto mix = [&](std::uint64_t byte) { h = (h ^ byte) * 0x100'0000'01b3ull; };
  // This function's own name carries V and Codec (GCC: "... [with V = float; Codec = ...]").
  for (char c : std::string_view(std::source_location::current().function_name())) mix(static_cast<unsigned char>(c));
  for (int s = 0; s < shards.servers(); ++s) {
    const std::uint64_t bytes = payload_offsets<V>(codec, shards.shard(s)).back();
    for (int b = 0; b < 64; b += 8) mix((bytes >> b) & 0xff);
  }
  return h;
}

// A worker's side of one server's pushes: a codec state per piece, allocated once, and the
// payload buffer the pushes are encoded into. The payload stays until the next encode: a
// sync push may be resent to a standby from it (worker::fail_over), the same bytes, as
// encoding again would move the states twice.
template <class Codec, class V>
class push_encoder {
 public:
  push_encoder() = default;
  push_encoder(const Codec& codec, std::span<const piece> pieces)
      : at_(payload_offsets<V>(codec, pieces)), payload_(at_.back()) {
    states_.reserve(pieces.size());
    for (const auto& p : pieces) states_.push_back(codec.template init<V>(p.size()));
  }

  std::size_t bytes() const noexcept { return payload_.size(); }
  std::span<const std::byte> payload() const noexcept { return payload_.span(); }

  // Each piece of `grads` (the full gradient tensors) through its state into the payload.
  void encode(const Codec& codec, std::span<const piece> pieces, std::span<const std::span<const V>> grads) {
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const piece& p = pieces[k];
      codec.encode(states_[k], grads[p.tensor].subspan(p.begin, p.size()),
                   payload_.span().subspan(at_[k], at_[k + 1] - at_[k]));
    }
  }

 private:
  std::vector<std::size_t> at_;
  std::vector<typename Codec::template state<V>> states_;  // [piece]
  aligned_buffer<std::byte> payload_;
};

// A server's side: its shard's payload layout, the buffer a tagged push lands in, and the
// decode of a push into the shard's order (decode: out = the push; decode_add: out += it).
template <class Codec, class V>
class push_decoder {
 public:
  push_decoder() = default;
  push_decoder(const Codec& codec, std::span<const piece> pieces)
      : codec_(codec), pieces_(pieces), at_(payload_offsets<V>(codec, pieces)), landing_(at_.back()) {}

  std::size_t bytes() const noexcept { return landing_.size(); }
  std::span<std::byte> landing() noexcept { return landing_.span(); }

  // who(): names the server and the worker, for a payload of another size (errc::mismatch)
  // or one the codec refuses (the codec's errc); called only then.
  template <bool Add, class Who>
  void decode(std::span<const std::byte> payload, std::span<V> out, Who&& who) const {
    if (payload.size() != bytes())
      throw error(errc::mismatch, who() + " pushed a payload of " + std::to_string(payload.size()) +
                                      " bytes through codec " + codec_name<Codec>() + ", which this server decodes "
                                      "from " + std::to_string(bytes()) + "; do all ranks use the same codec and settings?");
    try {
      std::size_t begin = 0;
      for (std::size_t k = 0; k < pieces_.size(); ++k) {
        const std::size_t n = pieces_[k].size();
        const auto in = payload.subspan(at_[k], at_[k + 1] - at_[k]);
        if constexpr (Add)
          codec_.decode_add(in, out.subspan(begin, n));
        else
          codec_.decode(in, out.subspan(begin, n));
        begin += n;
      }
    } catch (const error& e) {
      throw error(e.kind(), who() + "'s push does not decode through codec " + codec_name<Codec>() + " (" +
                                e.details() + "): its payload of each piece is encoded_bytes<V>(piece size), which "
                                "its decode must take; check the codec's encoded_bytes against its encode and decode");
    }
  }

 private:
  Codec codec_;
  std::span<const piece> pieces_;
  std::vector<std::size_t> at_;
  aligned_buffer<std::byte> landing_;
};

}  // namespace gradwire::ps::detail
