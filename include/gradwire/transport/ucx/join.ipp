// ucx joining a job: addresses through the store, one or two endpoints per peer, the greeting, closing endpoints.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../rendezvous/host_identity.hpp"
#include "../../rendezvous/store.hpp"
#include "../detail/join.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_engine::join() {
  const int me = options.rank, n = options.size;
  const join_deadline time(options.connect_timeout);
  const deadline until = time.until;
  if (options.rejoin) return join_back(until);
  std::vector<std::vector<std::byte>> addresses(static_cast<std::size_t>(n));
  addresses[me] = worker_address();
  std::optional<rendezvous::store_client> client;
  if (n > 1) {
    start_rendezvous(name, options, options.serve_store, store_server);
    auto& store = client.emplace(options.store_host, options.store_port, options.job_token, time.left());
    store.set(options.store_prefix + std::to_string(me), addresses[me]);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      store.set_timeout(time.left());
      try {
        addresses[r] = store.get(options.store_prefix + std::to_string(r));
      } catch (const error& e) {
        if (e.kind() != errc::timeout) throw;
        throw error(errc::timeout, "rank " + std::to_string(me) + ": rank " + std::to_string(r) +
                                       " did not connect (publish its UCX address) within " +
                                       std::to_string(options.connect_timeout.count()) +
                                       " ms: did it start, with the same WORLD_SIZE and job token?");
      }
      check_published_address(r, addresses[r]);
    }
    // Which ranks share this rank's host: one more store key per rank.
    const std::string identity = rendezvous::local_host_identity(options.host_id);
    topology = rendezvous::exchange_topology(store, options.store_prefix + "host/", me, n, identity, identity, time.left());
  }
  for (int r = 0; r < n; ++r) peer_address(r, addresses[r]);
  post_control_receive();
  greet_everyone(until);
  joining = false;
}

// Every rank hears from every other before it goes on, as over TCP: a rank that
// finishes (or fails) early cannot leave before a slower one has reached it, and no
// rank still needs the store (rank 0's) once it has been greeted.
GRADWIRE_DECL void ucx_engine::greet_everyone(deadline until) {
  const int me = options.rank, n = options.size;
  std::vector<std::unique_ptr<ucx_op>> ops;
  std::uint32_t hello = 1;
  std::vector<std::uint32_t> heard(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    auto send = make_op(true, r, ucx_tag::join_tag, reinterpret_cast<std::byte*>(&hello), sizeof hello);
    post_send(*send);
    ops.push_back(std::move(send));
    auto recv = make_op(false, r, ucx_tag::join_tag, reinterpret_cast<std::byte*>(&heard[r]), sizeof hello);
    post_recv(*recv);
    ops.push_back(std::move(recv));
  }
  auto all_done = [&] { return std::all_of(ops.begin(), ops.end(), [](const auto& o) { return o->state == status::done; }); };
  const bool done = progress_until(all_done, until);
  std::string missing;
  for (auto& op : ops) {
    if (!op->is_send && op->state != status::done) missing += (missing.empty() ? "" : ", ") + std::to_string(op->peer);
    if (op->state != status::done) cancel(*op);
    forget(*op);
  }
  throw_if_failed();
  if (!done)
    throw error(errc::timeout, "rank " + std::to_string(me) + ": ranks " + missing + " did not connect within " +
                                   std::to_string(options.connect_timeout.count()) + " ms");
  for (auto& op : ops)
    if (op->failure != errc{}) throw error(op->failure, op->message.empty() ? why_failed(*op) : op->message);
}

GRADWIRE_DECL void ucx_engine::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<ucx_engine*>(arg);
  for (std::size_t r = 0; r < self->peers.size(); ++r)
    if (self->peers[r].ep == ep || self->peers[r].bulk_ep == ep)
      self->broken_endpoints.push_back({static_cast<int>(r), status, ep});
}

// What rank r published: a header (its world size, which must be this job's, and its host
// id) and a worker address.
GRADWIRE_DECL void ucx_engine::check_published_address(int r, const std::vector<std::byte>& address) const {
  if (address.size() <= address_header)
    throw error(errc::protocol, "rank " + std::to_string(r) + " published a malformed UCX address");
  std::uint32_t size = 0;
  std::memcpy(&size, address.data(), sizeof size);
  if (size != static_cast<std::uint32_t>(options.size))
    throw error(errc::config, world_size_mismatch_message(static_cast<std::uint64_t>(r), size, options.rank, options.size));
}

// Endpoints to `peer` at its published address (with its header: world size, host id).
GRADWIRE_DECL void ucx_engine::peer_address(int peer, std::span<const std::byte> address) {
  // A second endpoint for bulk messages only pays where it unlocks a transport: shared memory.
  const bool bulk = options.peer_error_handling && options.bulk_bytes > 0 && ucx_may_use_shared_memory();
  std::uint64_t host = 0;
  std::memcpy(&host, address.data() + sizeof(std::uint32_t), sizeof host);
  auto& p = peers[peer];
  p.same_host = host == ucx_host_id();
  p.eager_below_bulk = p.same_host && ucx_may_use_shared_memory();
  const std::vector<std::byte> bytes(address.begin(), address.end());
  p.ep = connect(peer, bytes, options.peer_error_handling);
  p.bulk_ep = bulk && peer != options.rank ? connect(peer, bytes, false) : p.ep;
}

GRADWIRE_DECL ucp_ep_h ucx_engine::connect(int peer, const std::vector<std::byte>& address, bool error_handling) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data() + address_header);
  p.err_mode = error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  p.err_handler.cb = &ucx_engine::on_endpoint_error;
  p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t s = ucp_ep_create(worker.get(), &p, &ep);
  if (s != UCS_OK)
    throw error(errc::config, "rank " + std::to_string(options.rank) + ": UCX cannot reach rank " +
                                  std::to_string(peer) + ": " + ucx_status_text(s) +
                                  " (do UCX_TLS and UCX_NET_DEVICES allow a transport between them?)");
  return ep;
}

GRADWIRE_DECL void ucx_engine::close_endpoint(ucx_peer& p) noexcept {
  for (ucp_rkey_h k : std::exchange(p.rkeys, {})) ucp_rkey_destroy(k);
  if (p.bulk_ep != p.ep) close_endpoint(std::exchange(p.bulk_ep, nullptr));
  p.bulk_ep = nullptr;
  close_endpoint(std::exchange(p.ep, nullptr));
}

GRADWIRE_DECL void ucx_engine::close_endpoint(ucp_ep_h ep) noexcept {
  if (!ep) return;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
  const ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
  if (!UCS_PTR_IS_PTR(r)) return;
  const auto until = clock::now() + std::chrono::seconds(1);
  while (ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until) ucp_worker_progress(worker.get());
  ucp_request_free(r);
}

GRADWIRE_DECL void ucx_engine::close_endpoints() noexcept {
  if (!worker) return;
  for (auto& p : peers) close_endpoint(p);
  if (control_request) ucp_request_cancel(worker.get(), control_request);  // its callback frees it
}

}  // namespace gradwire::transport::detail
