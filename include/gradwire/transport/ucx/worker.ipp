// ucx's worker: the UCP context and worker, and its address.
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

}  // namespace gradwire::transport::detail
