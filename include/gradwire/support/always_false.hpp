// always_false_v<T>: false, but only once T is known, so a primary template's static_assert fires only when chosen.
#pragma once

namespace gradwire::support {

template <class>
inline constexpr bool always_false_v = false;

}  // namespace gradwire::support
