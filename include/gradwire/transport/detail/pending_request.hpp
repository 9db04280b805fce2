// The request handle transports return: owns one operation, and withdraws it if dropped before it completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "../../error.hpp"
#include "../../timeouts.hpp"

namespace gradwire::transport::detail {

// Engine: the transport's shared state, with `void cancel(Op&) noexcept` that withdraws
// an unfinished op (and does nothing to a finished one), so that its buffer may go.
template <class Engine, class Op>
class pending_request {
 public:
  pending_request() = default;
  pending_request(std::shared_ptr<Engine> engine, std::unique_ptr<Op> op)
      : engine_(std::move(engine)), op_(std::move(op)) {}
  pending_request(pending_request&&) noexcept = default;
  pending_request& operator=(pending_request&& other) noexcept {
    if (this != &other) {
      release();
      engine_ = std::move(other.engine_);
      op_ = std::move(other.op_);
    }
    return *this;
  }
  ~pending_request() { release(); }

  // For the transport's wait: hands the op over; the request is finished whatever the
  // wait reports (wait returns or throws only once the op is done or withdrawn).
  std::unique_ptr<Op> take() noexcept { return std::move(op_); }
  // For the transport's wait_any: the op, still owned by the request (nullptr if empty).
  const Op* peek() const noexcept { return op_.get(); }
  explicit operator bool() const noexcept { return op_ != nullptr; }

 private:
  void release() noexcept {
    if (op_) engine_->cancel(*op_);
    op_.reset();
  }
  std::shared_ptr<Engine> engine_;
  std::unique_ptr<Op> op_;
};

// A point-to-point operation of rank `me` with `peer` (Op: an op type with these fields,
// as inproc's and the simulator's): who sends, who receives, and where the bytes are.
template <class Op, class Deliver>
std::unique_ptr<Op> make_operation(bool is_send, int me, int peer, std::uint64_t tag, std::byte* data,
                                   std::size_t bytes, Deliver deliver) {
  auto op = std::make_unique<Op>();
  op->is_send = is_send;
  op->source = is_send ? me : peer;
  op->destination = is_send ? peer : me;
  op->tag = tag;
  op->data = data;
  op->bytes = bytes;
  op->deliver = deliver;
  return op;
}

// Starts an operation: the request owns `op` before `post(op)` runs, so that an
// exception while posting withdraws it (the request's destructor) instead of leaving
// it queued and freed.
template <class Engine, class Op, class Post>
pending_request<Engine, Op> start_operation(const std::shared_ptr<Engine>& engine, std::unique_ptr<Op> op, Post&& post) {
  Op& posted = *op;
  pending_request<Engine, Op> r(engine, std::move(op));
  post(posted);
  return r;
}

// Finishes a request with engine.wait(op, until) (which returns or throws once the op is
// done or withdrawn); whatever goes wrong, the op is withdrawn before it is freed.
template <class Engine, class Op>
void finish_operation(Engine& engine, pending_request<Engine, Op>& r, deadline until, const char* transport) {
  const auto op = r.take();
  if (!op) throw error(errc::invalid_argument, std::string(transport) + ": wait on an empty or already finished request");
  try {
    engine.wait(*op, until);
  } catch (...) {
    engine.cancel(*op);
    throw;
  }
}

}  // namespace gradwire::transport::detail
