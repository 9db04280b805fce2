// A type's readable name (demangled where the compiler's ABI allows), for logs and error messages.
#pragma once

#include <cstdlib>
#include <string>
#include <typeinfo>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif

namespace gradwire::observe {

template <class T>
std::string type_name() {
  const char* mangled = typeid(T).name();
#if __has_include(<cxxabi.h>)
  int status = 0;
  if (char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status)) {
    std::string out(readable);
    std::free(readable);
    return out;
  }
#endif
  return mangled;
}

}  // namespace gradwire::observe
