// Checks and unaligned reads/writes of a codec's payload bytes, shared by the codecs.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "../../error.hpp"

namespace gradwire::compress::detail {

// A payload of the wrong size is the caller's mistake (its buffer was not sized by
// encoded_bytes<V>(n)), never something to read past.
inline void check_payload(const char* codec, std::size_t bytes, std::size_t expected, std::size_t n) {
  if (bytes != expected)
    throw error(errc::invalid_argument, std::string("gradwire::compress::") + codec + ": a payload of " +
                                            std::to_string(bytes) + " bytes for " + std::to_string(n) +
                                            " elements, which take " + std::to_string(expected) +
                                            "; size it with encoded_bytes<V>(n) of the same codec and options");
}

// The state of a codec that keeps nothing between steps but the length it was made for
// (checked against each buffer: check_state).
template <class V>
struct length_state {
  std::size_t n = 0;
  // Nothing for a checkpoint to carry (DiLoCo's compressed pseudo-gradients save each
  // call's codec state through these).
  template <class F>
  void for_each_buffer(F&&) const noexcept {}
  template <class F>
  void for_each_counter(F&&) const noexcept {}
};

inline void check_state(const char* codec, std::size_t state_elements, std::size_t n) {
  if (state_elements != n)
    throw error(errc::invalid_argument, std::string("gradwire::compress::") + codec + ": a buffer of " +
                                            std::to_string(n) + " elements with a state made for " +
                                            std::to_string(state_elements) +
                                            "; keep one state per buffer, made by init<V>(n) with its length");
}

// A codec whose payload is this many bytes per element, each from that element alone (fp16,
// bf16: 2), so that encoding a buffer piece by piece gives the same bytes; 0: not such a codec.
template <class Codec>
inline constexpr std::size_t elementwise_bytes = 0;

// Payload bytes carry no alignment: read and write through memcpy (one move on x86).
template <class T>
T load(const std::byte* at) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}
template <class T>
void store(std::byte* at, T value) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(at, &value, sizeof(T));
}

}  // namespace gradwire::compress::detail
