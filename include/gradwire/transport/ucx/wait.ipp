// ucx's progress and waits: polling the worker, handling what its callbacks saw, flushing, settling a request.
#pragma once

#include <chrono>
#include <thread>
#include <vector>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Progresses the worker until UCX has let go of op's request (bounded).
GRADWIRE_DECL void ucx_engine::settle(ucx_op& op) noexcept {
  const auto until = clock::now() + std::chrono::seconds(2);
  while (op.request && clock::now() < until)
    if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
}

GRADWIRE_DECL unsigned ucx_engine::progress_once() {
  unsigned n = 0;
  while (unsigned k = ucp_worker_progress(worker.get())) n += k;
  handle_events();
  return n;
}

// What UCX reported from inside its callbacks, handled outside them.
GRADWIRE_DECL void ucx_engine::handle_events() {
  // A failure report that arrives while this rank still greets is about the job's
  // first operation: it is reported there, as over TCP, not as a failed join.
  while (control_arrived && (!joining || rejoining)) {
    control_arrived = false;
    on_control();
  }
  while (!broken_endpoints.empty()) {
    const broken_endpoint b = broken_endpoints.front();
    broken_endpoints.erase(broken_endpoints.begin());
    if (peers[b.peer].ep == b.ep || peers[b.peer].bulk_ep == b.ep) on_broken(b.peer, b.status);
  }
  const auto now = clock::now();
  for (std::size_t r = 0; r < peers.size(); ++r)
    if (peers[r].drained_at && now >= *peers[r].drained_at) {
      peers[r].drained_at.reset();
      fail_receives_from(static_cast<int>(r));
    }
  // Not while this rank aborts: its own reason is the one it reports and sends.
  for (std::size_t r = 0; r < peers.size() && !aborting; ++r)
    if (peers[r].state.suspected() && now >= *peers[r].state.suspected_until) fail_from_loss(static_cast<int>(r));
}

// Waits (bounded) until what this rank sent has reached its peers.
GRADWIRE_DECL void ucx_engine::flush(deadline until) {
  ucp_request_param_t p{};
  const ucs_status_ptr_t r = ucp_worker_flush_nbx(worker.get(), &p);
  if (!UCS_PTR_IS_PTR(r)) return;
  while (ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until)
    if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
  if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker.get(), r);
  ucp_request_free(r);
}

}  // namespace gradwire::transport::detail
