// Error codes and the exception type every gradwire failure is reported with.
#pragma once

#include <string>
#include <system_error>

namespace gradwire {

// Expected failures. Each has a message that says what happened and what to do.
enum class errc {
  timeout = 1,       // a blocking call passed its deadline
  peer_lost,         // another rank failed or went away
  mismatch,          // ranks disagree (collective kind, count, dtype, message size)
  protocol,          // a message that does not parse
  auth,              // wrong job token
  config,            // missing or contradictory configuration
  invalid_argument,  // a bad value passed by the caller (negative lr, wrong size, ...)
  device,            // the CUDA runtime failed (no device, out of memory, a kernel fault)
};

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "gradwire"; }
  std::string message(int code) const override {
    switch (static_cast<errc>(code)) {
      case errc::timeout: return "timeout";
      case errc::peer_lost: return "peer lost";
      case errc::mismatch: return "mismatch between ranks";
      case errc::protocol: return "protocol error";
      case errc::auth: return "authentication failed";
      case errc::config: return "configuration error";
      case errc::invalid_argument: return "invalid argument";
      case errc::device: return "device error";
    }
    return "unknown gradwire error";
  }
};
}  // namespace detail

inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

// The exception gradwire throws; code() tells the kind, what() the details.
class error : public std::system_error {
 public:
  error(errc code, const std::string& what) : std::system_error(make_error_code(code), what), details_(what) {}
  errc kind() const noexcept { return static_cast<errc>(code().value()); }
  // what() without the kind appended: for wrapping an error in one with more context.
  const std::string& details() const noexcept { return details_; }

 private:
  std::string details_;
};

}  // namespace gradwire

template <>
struct std::is_error_code_enum<gradwire::errc> : std::true_type {};
