// ucx's worker: the UCP context and worker, its address, and progress (polling, then sleeping on its event fd).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../observe/activity.hpp"
#include "../../observe/log.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_engine::open_worker() {
  // UCX's TCP moves messages through 8 KiB send and 64 KiB receive segments; larger
  // ones cut the system calls per message (2-rank all-reduce over loopback, 1-64 MiB:
  // 1.1-1.2 -> 1.4-2.3 GB/s busbw, the 2-core development VM).
  // (Through the environment, without overwriting: UCX 1.13's TCP transport does not
  // take these from ucp_config_modify.)
  const long long beat = options.heartbeat_interval.count();
  const std::string beat_text = std::to_string(beat > 0 ? beat : 1) + "s";
  if (ucx_may_use_tcp()) {
    ::setenv("UCX_TCP_TX_SEG_SIZE", "256k", 0);
    ::setenv("UCX_TCP_RX_SEG_SIZE", "1m", 0);
    if (beat > 0) {  // a host cut off from the network answers no probe: its sockets fail
      ::setenv("UCX_TCP_KEEPIDLE", beat_text.c_str(), 0);
      ::setenv("UCX_TCP_KEEPINTVL", beat_text.c_str(), 0);
      ::setenv("UCX_TCP_KEEPCNT", std::to_string(std::max(1, options.heartbeat_misses)).c_str(), 0);
    }
  }
  ucp_config_t* raw_config = nullptr;
  ucx_check(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read");
  ucp_config_ptr config(raw_config);
  // Shared-memory transports detect a dead peer only when asked to (keepalive checks
  // that its process still exists), and keepalive runs every 20 s unless told otherwise.
  if (ucx_may_use_shared_memory()) ucx_default(config.get(), "MM_ERROR_HANDLING", "y");
  ucx_default(config.get(), "KEEPALIVE_INTERVAL", beat_text.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  if (options.one_sided != ucx_options::one_sided_use::never) params.features |= UCP_FEATURE_RMA;
  params.estimated_num_eps = static_cast<std::size_t>(options.size);
  ucp_context_h raw_context = nullptr;
  ucx_check(ucp_init(&params, config.get(), &raw_context), "ucp_init");
  context.reset(raw_context);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, not always the same one (the collectives' background thread).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h raw_worker = nullptr;
  ucx_check(ucp_worker_create(context.get(), &worker_params, &raw_worker), "ucp_worker_create");
  worker.reset(raw_worker);
  ucx_check(ucp_worker_get_efd(worker.get(), &event_fd), "ucp_worker_get_efd");
}

GRADWIRE_DECL std::vector<std::byte> ucx_engine::worker_address() {
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  ucx_check(ucp_worker_get_address(worker.get(), &address, &length), "ucp_worker_get_address");
  // [u32 world size this rank was started with][u64 host id][UCP worker address]
  std::vector<std::byte> out(address_header + length);
  const auto size = static_cast<std::uint32_t>(options.size);
  const std::uint64_t host = ucx_host_id();
  std::memcpy(out.data(), &size, sizeof size);
  std::memcpy(out.data() + sizeof size, &host, sizeof host);
  std::memcpy(out.data() + address_header, address, length);
  ucp_worker_release_address(worker.get(), address);
  return out;
}

// Progresses the worker until UCX has let go of op's request (bounded).
GRADWIRE_DECL void ucx_engine::settle(ucx_op& op) noexcept {
  const auto until = deadline_after(std::chrono::seconds(2));
  while (op.request && clock::now() < until)
    if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
}

// "rank 0: waited 60.0 s in all_reduce (operation #12, step 40) for rank 1"
GRADWIRE_DECL std::string ucx_engine::stall_text(clock::duration waited, int peer) const {
  const observe::activity& doing = observe::current_activity();
  char text[256];
  std::snprintf(text, sizeof text, "rank %d: waited %.1f s in %s (operation #%llu, step %llu) for %s%s", options.rank,
                std::chrono::duration<double>(waited).count(), doing.name ? doing.name : "a transport wait",
                static_cast<unsigned long long>(doing.operation),
                static_cast<unsigned long long>(observe::current_step().load(std::memory_order_relaxed)),
                peer >= 0 ? "rank " : "its peers", peer >= 0 ? std::to_string(peer).c_str() : "");
  return text;
}

namespace ucx_stall {
inline constexpr const char* alive =
    ": it is alive as far as UCX can tell but has not answered (stopped, hung, in a long computation, or waiting for "
    "another rank: look at its own warning)";
}  // namespace ucx_stall

GRADWIRE_DECL void ucx_engine::warn_stall(clock::duration waited, int peer) const {
  observe::log_warning(options.rank, options.size, stall_text(waited, peer).c_str(), ucx_stall::alive);
}

// The stall timeout: this rank fails with timeout naming the rank it waited for (over UCX,
// without the chain of waits behind it), and tells its peers why.
GRADWIRE_DECL void ucx_engine::give_up_stall(clock::duration waited, int peer) {
  const std::string who = peer >= 0 ? stalled_message({peer}, stall.gave_up_text())
                                    : "the peers it waits for stalled " + stall.gave_up_text();
  const std::string why = who + ": " + stall_text(waited, peer) + ucx_stall::alive;
  abort_with(errc::timeout, why, -1, why);
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
  while (control_arrived && !joining) {
    control_arrived = false;
    on_control();
  }
  while (!broken_endpoints.empty()) {
    const auto [peer, s] = broken_endpoints.front();
    broken_endpoints.erase(broken_endpoints.begin());
    on_broken(peer, s);
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
