// UCX plumbing for transport::ucx: owning handles for UCP objects, tag layout, and waiting on the worker's event fd.
#pragma once

#include <poll.h>
#include <ucp/api/ucp.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>

#include "../../error.hpp"

namespace gradwire::transport::detail {

// "UCX ucp_init: No such device (UCX_TLS=...)" for a failed UCX call.
inline std::string ucx_status_text(ucs_status_t status) { return ucs_status_string(status); }

inline void ucx_check(ucs_status_t status, const char* call) {
  if (status == UCS_OK) return;
  const char* tls = std::getenv("UCX_TLS");
  throw error(errc::config, std::string("UCX ") + call + " failed: " + ucx_status_text(status) +
                                (tls ? std::string(" (UCX_TLS=") + tls + ")" : std::string()));
}

struct ucp_config_deleter {
  void operator()(ucp_config_t* c) const noexcept { ucp_config_release(c); }
};
struct ucp_context_deleter {
  void operator()(ucp_context* c) const noexcept { ucp_cleanup(c); }
};
struct ucp_worker_deleter {
  void operator()(ucp_worker* w) const noexcept { ucp_worker_destroy(w); }
};
using ucp_config_ptr = std::unique_ptr<ucp_config_t, ucp_config_deleter>;
using ucp_context_ptr = std::unique_ptr<ucp_context, ucp_context_deleter>;
using ucp_worker_ptr = std::unique_ptr<ucp_worker, ucp_worker_deleter>;

// A UCP tag: UCP matches receives on tag and mask only, not on the sender, so the
// sender's rank travels in the tag.
//   bit 63       control message (goodbye, abort) of the transport itself
//   bits 48..62  the sender's rank
//   bits 0..47   the caller's tag (every tag gradwire itself uses fits)
namespace ucx_tag {
inline constexpr int rank_shift = 48;
inline constexpr std::uint64_t control_bit = std::uint64_t{1} << 63;
inline constexpr std::uint64_t user_mask = (std::uint64_t{1} << rank_shift) - 1;
inline constexpr int max_ranks = 1 << 15;
inline constexpr std::uint64_t full_mask = ~std::uint64_t{0};
// Matches every data message of one sender (not its control messages).
inline constexpr std::uint64_t source_mask = control_bit | (std::uint64_t(max_ranks - 1) << rank_shift);
inline constexpr std::uint64_t join_tag = user_mask;  // the join's greetings; callers' tags stay below it

inline constexpr std::uint64_t data(int source, std::uint64_t tag) noexcept {
  return (static_cast<std::uint64_t>(source) << rank_shift) | tag;
}
// Control messages name their sender in the payload as well: UCX 1.13 does not always
// report the tag a message arrived with.
inline constexpr std::uint64_t control(int source) noexcept { return control_bit | data(source, 0); }
}  // namespace ucx_tag

// Sets a UCX setting in `config` unless the environment already sets it (UCX_<name>):
// gradwire's defaults never override what the user chose.
inline void ucx_default(ucp_config_t* config, const char* name, const char* value) {
  if (std::getenv((std::string("UCX_") + name).c_str())) return;
  ucx_check(ucp_config_modify(config, name, value), name);
}

// Whether UCX_TLS allows one of the transports `names` (unset, "all" or an exclusion list:
// UCX chooses, and may choose them).
inline bool ucx_tls_allows(std::initializer_list<const char*> names) {
  const char* tls = std::getenv("UCX_TLS");
  if (!tls) return true;
  const std::string list = tls;
  if (!list.empty() && list.front() == '^') return true;
  auto listed = [&](const char* name) {
    for (std::size_t at = list.find(name); at != std::string::npos; at = list.find(name, at + 1)) {
      const std::size_t end = at + std::strlen(name);
      if ((at == 0 || list[at - 1] == ',') && (end == list.size() || list[end] == ',')) return true;
    }
    return false;
  };
  if (listed("all")) return true;
  return std::any_of(names.begin(), names.end(), listed);
}

inline bool ucx_may_use_shared_memory() { return ucx_tls_allows({"sm", "shm", "mm", "posix", "sysv"}); }
inline bool ucx_may_use_tcp() { return ucx_tls_allows({"tcp"}); }

// Names this machine (its host name and this boot), so that ranks can tell which peers
// share it: FNV-1a over both.
inline std::uint64_t ucx_host_id() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string& part : {std::string(name), boot})
    for (const char c : part) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Sleeps until the worker's event fd signals or `timeout` passes.
inline void wait_for_event(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  const int ms = static_cast<int>(std::max<long long>(0, timeout.count()));
  const int r = ::poll(&p, 1, ms);
  if (r < 0 && errno != EINTR) throw error(errc::config, std::string("ucx: poll on the worker's event fd failed: ") + std::strerror(errno));
}

}  // namespace gradwire::transport::detail
