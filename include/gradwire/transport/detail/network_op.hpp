// The operation every network transport queues: who, which tag, which bytes, and how it ended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "../../error.hpp"

namespace gradwire::transport::detail {

// queued: posted, not yet touched by the backend (asio_tcp; ucx hands an op to UCX at
// once, so its ops begin active); active: the backend reads into or writes from its
// buffer; done: finished, `failure` says how; cancelled: withdrawn, never waited for.
enum class op_status : std::uint8_t { queued, active, done, cancelled };

// A backend's op derives from this and adds what its send and receive paths need.
struct network_op {
  using status = op_status;
  bool is_send = false;
  int peer = 0;
  std::uint64_t tag = 0;
  std::byte* data = nullptr;  // never written through for sends
  std::size_t bytes = 0;
  status state = status::queued;
  errc failure{};
  std::string message;

  void finish(errc e = {}, std::string why = {}) {
    state = status::done;
    failure = e;
    message = std::move(why);
  }
};

}  // namespace gradwire::transport::detail
