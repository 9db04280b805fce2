// Test helper: the gradwire::error a callable throws, as (kind, message), or what a call ended with.
#pragma once

#include <catch2/catch.hpp>

#include <gradwire/error.hpp>
#include <string>
#include <utility>

namespace gradwire::testing {

// Fails the test if fn does not throw a gradwire::error.
template <class Fn>
std::pair<errc, std::string> error_of(Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    return {e.kind(), e.what()};
  }
  FAIL("expected a gradwire::error");
  return {};
}

// What one rank (or one call) ended with: no error (kind == errc{}), or a gradwire::error.
struct outcome {
  errc kind{};
  std::string what;
  bool failed() const { return kind != errc{}; }
};

template <class Fn>
outcome outcome_of(Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    return {e.kind(), e.what()};
  }
  return {};
}

}  // namespace gradwire::testing
