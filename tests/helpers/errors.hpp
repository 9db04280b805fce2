// Test helper: the gradwire::error a callable throws, as (kind, message).
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

}  // namespace gradwire::testing
