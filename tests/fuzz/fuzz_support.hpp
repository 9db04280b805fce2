// What every fuzz harness shares: reading fields off the fuzzer's input, and failing loudly on a finding.
//
// A harness (LLVMFuzzerTestOneInput) feeds its input to one of gradwire's parsers. A
// gradwire::error of the kinds the parser documents is the expected answer to bad input;
// anything else is a finding: another exception type escapes (std::terminate), a
// sanitizer fires, or a property the harness checks with GRADWIRE_FUZZ_CHECK (a round
// trip, an error of the wrong kind or that does not name its source) is false, which calls
// finding(): it aborts. libFuzzer and the replay driver (replay_main.cpp) both report an
// abort as a failure.
#pragma once

#include <gradwire/error.hpp>
#include <gradwire/support/wire.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace gradwire::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "gradwire fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace detail {
[[noreturn]] inline void failed_check(const char* property, const char* file, int line, const std::string& what) {
  finding(what + " (GRADWIRE_FUZZ_CHECK(" + property + ") at " + file + ":" + std::to_string(line) + ")");
}
}  // namespace detail

// GRADWIRE_FUZZ_CHECK(property, what): a harness's assertion; a finding (abort) naming
// `what` when `property` is false. A macro for what only the preprocessor does: `what`
// (often a std::string built from the input) is evaluated only when the property fails,
// so the millions of executions that pass build no message, and the finding quotes the
// property's source text and line.
#define GRADWIRE_FUZZ_CHECK(property, what) \
  ((property) ? void() : ::gradwire::fuzz::detail::failed_check(#property, __FILE__, __LINE__, (what)))

// A rejection must be one of the documented kinds, and its message must contain `names`
// (the variable, file or peer it is about) when that is not empty.
inline void expect_error(const error& e, std::initializer_list<errc> kinds, std::string_view names = {}) {
  GRADWIRE_FUZZ_CHECK(std::find(kinds.begin(), kinds.end(), e.kind()) != kinds.end(),
                      std::string("rejected with an unexpected error kind: ") + e.what());
  GRADWIRE_FUZZ_CHECK(names.empty() || std::string_view(e.what()).find(names) != std::string_view::npos,
                      "the error does not name '" + std::string(names) + "': " + e.what());
}

// The input as text, parsed by `parse`: the value, or none when `parse` rejects it with
// an error of one of `kinds` that names `names` (see expect_error). For the harnesses of
// parsers that read a whole text (a variable's value, a description).
template <class Parse>
auto parse_text(const std::uint8_t* data, std::size_t size, Parse parse, std::initializer_list<errc> kinds,
                std::string_view names) -> std::optional<decltype(parse(std::string()))> {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    return parse(text);
  } catch (const error& e) {
    expect_error(e, kinds, names);
    return std::nullopt;
  }
}

// The fuzzer's input, consumed from the front.
class input {
 public:
  input(const std::uint8_t* data, std::size_t size) : bytes_(reinterpret_cast<const std::byte*>(data), size) {}

  bool empty() const noexcept { return bytes_.empty(); }
  std::size_t size() const noexcept { return bytes_.size(); }

  // One byte (0 once the input is used up).
  std::uint8_t byte() {
    if (bytes_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(bytes_.front());
    bytes_ = bytes_.subspan(1);
    return b;
  }
  // An integer from up to sizeof(T) bytes, little-endian (missing bytes are 0).
  template <class T>
  T integer() {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t{byte()} << (8 * i);
    return static_cast<T>(v);
  }
  // Up to n bytes.
  std::span<const std::byte> take(std::size_t n) {
    n = std::min(n, bytes_.size());
    const auto out = bytes_.first(n);
    bytes_ = bytes_.subspan(n);
    return out;
  }
  // The bytes up to the next `separator` (which is consumed) or to the end.
  std::string until(char separator) {
    const auto* begin = reinterpret_cast<const char*>(bytes_.data());
    const auto* end = static_cast<const char*>(std::memchr(begin, separator, bytes_.size()));
    const std::size_t n = end ? static_cast<std::size_t>(end - begin) : bytes_.size();
    std::string out(begin, n);
    bytes_ = bytes_.subspan(std::min(bytes_.size(), n + 1));
    return out;
  }
  std::span<const std::byte> rest() { return take(bytes_.size()); }
  std::string rest_text() {
    const auto r = rest();
    return std::string(reinterpret_cast<const char*>(r.data()), r.size());
  }

 private:
  std::span<const std::byte> bytes_;
};

// A frame header off the input, then its payload: the header's bytes as given (fewer than
// 48 when the input runs out) in a zero-padded array, and the rest. Mode bit 0 writes the
// right header CRC and bit 1 the right payload CRC (computed by `crc`), so that the
// fuzzer also gets past them to the checks behind.
struct frame_input {
  std::array<std::byte, support::wire::header_size> header{};
  std::size_t given = 0;
  std::span<const std::byte> payload;
  std::span<const std::byte> given_header() const { return std::span(header.data(), given); }
};
template <class Crc>
frame_input take_frame(input& in, std::uint8_t mode, Crc crc) {
  namespace wire = support::wire;
  frame_input f;
  const auto given = in.take(wire::header_size);
  std::memcpy(f.header.data(), given.data(), given.size());
  f.given = given.size();
  f.payload = in.rest();
  if (f.given == wire::header_size) {
    const auto length = wire::detail::get<std::uint64_t>(f.header.data() + 32);
    if (mode & 2)
      wire::detail::put<std::uint32_t>(f.header.data() + 12, crc(f.payload.first(std::min<std::uint64_t>(length, f.payload.size()))));
    if (mode & 1) wire::detail::put<std::uint32_t>(f.header.data() + 44, crc(std::span<const std::byte>(f.header).first(44)));
  }
  return f;
}

}  // namespace gradwire::fuzz
