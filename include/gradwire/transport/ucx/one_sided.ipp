// ucx's one-sided access, definitions (one_sided.hpp): windows exposed and attached, puts and gets.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "one_sided.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_memory_window::unmap::operator()(ucp_mem_h m) const noexcept { ucp_mem_unmap(owner->context.get(), m); }
GRADWIRE_DECL void ucx_remote_window::release::operator()(ucp_rkey_h k) const noexcept { owner->release_rkey(peer, k); }

GRADWIRE_DECL ucx_memory_window ucx_engine::expose(const std::shared_ptr<ucx_engine>& self, std::span<std::byte> memory) {
  if (memory.empty()) throw error(errc::invalid_argument, "ucx::expose: an empty window");
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = memory.data();
  p.length = memory.size();
  ucp_mem_h mapped = nullptr;
  ucx_check(ucp_mem_map(context.get(), &p, &mapped), "ucp_mem_map");
  ucx_memory_window w;
  w.memory_ = {mapped, ucx_memory_window::unmap{self}};
  void* packed = nullptr;
  std::size_t packed_size = 0;
  ucx_check(ucp_rkey_pack(context.get(), mapped, &packed, &packed_size), "ucp_rkey_pack");
  // [u64 address][u64 size][UCX's packed remote key]
  const std::uint64_t header[2] = {reinterpret_cast<std::uintptr_t>(memory.data()), memory.size()};
  w.key_.resize(sizeof header + packed_size);
  std::memcpy(w.key_.data(), header, sizeof header);
  std::memcpy(w.key_.data() + sizeof header, packed, packed_size);
  ucp_rkey_buffer_release(packed);
  return w;
}

GRADWIRE_DECL ucx_remote_window ucx_engine::attach(const std::shared_ptr<ucx_engine>& self, int peer, std::span<const std::byte> key) {
  if (peer < 0 || peer >= options.size)
    throw error(errc::invalid_argument, "ucx::attach: rank " + std::to_string(peer) + " is not in the job");
  std::uint64_t header[2];
  if (key.size() <= sizeof header)
    throw error(errc::protocol, "ucx::attach: rank " + std::to_string(peer) + "'s window key is malformed (" +
                                    std::to_string(key.size()) + " bytes)");
  throw_if_failed();
  auto& p = peers[peer];
  if (p.state.lost()) throw error(errc::peer_lost, p.state.lost_reason);
  if (!p.bulk_ep) throw error(errc::peer_lost, finished_message(options.rank, peer));
  std::memcpy(header, key.data(), sizeof header);
  auto unpack = [&](ucp_ep_h ep) {
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t s = ucp_ep_rkey_unpack(ep, key.data() + sizeof header, &rkey);
    if (s != UCS_OK)
      throw error(errc::protocol, "ucx::attach: cannot unpack rank " + std::to_string(peer) +
                                      "'s window key: " + ucx_status_text(s));
    p.rkeys.push_back(rkey);
    return std::unique_ptr<ucp_rkey, ucx_remote_window::release>(rkey, ucx_remote_window::release{self, peer});
  };
  ucx_remote_window w;
  w.rkey_ = unpack(p.ep);
  if (p.bulk_ep != p.ep) w.bulk_rkey_ = unpack(p.bulk_ep);
  w.address_ = header[0];
  w.size_ = static_cast<std::size_t>(header[1]);
  return w;
}

// UCX wants a remote key destroyed before its endpoint: closing an endpoint destroys
// the keys unpacked on it, and a window released later finds its key gone.
GRADWIRE_DECL void ucx_engine::release_rkey(int peer, ucp_rkey_h rkey) noexcept {
  auto& keys = peers[peer].rkeys;
  if (const auto it = std::find(keys.begin(), keys.end(), rkey); it != keys.end()) {
    keys.erase(it);
    ucp_rkey_destroy(rkey);
  }
}

GRADWIRE_DECL std::unique_ptr<ucx_op> ucx_engine::make_one_sided_op(const ucx_remote_window& w, std::size_t offset, std::byte* data,
                                                  std::size_t bytes, const char* what) {
  if (!w.rkey_) throw error(errc::invalid_argument, std::string("ucx: ") + what + " an empty remote window");
  if (offset > w.size_ || bytes > w.size_ - offset)
    throw error(errc::invalid_argument, std::string("ucx: ") + what + " rank " + std::to_string(w.peer()) + ": " +
                                            std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                                            " do not fit its window of " + std::to_string(w.size_) + " bytes");
  auto op = make_op(true, w.peer(), 0, data, bytes);
  op->one_sided = true;
  op->what = what;
  return op;
}

// A put is done once its bytes are in the peer's memory: the flush that follows it
// reports (UCX's own completion of a put only frees the local buffer).
// (A flush on the bulk endpoint, without error handling, may never complete once the
// peer died; small operations therefore take the endpoint that reports failures.)
GRADWIRE_DECL void ucx_engine::post_one_sided(ucx_op& op, const ucx_remote_window& w, std::uint64_t remote, bool put) {
  if (peer_unavailable(op)) return;
  auto& p = peers[op.peer];
  const bool bulk = op.bytes >= options.bulk_bytes && w.bulk_rkey_;
  ucp_ep_h ep = bulk ? p.bulk_ep : p.ep;
  ucp_rkey_h rkey = bulk ? w.bulk_rkey_.get() : w.rkey_.get();
  if (std::find(p.rkeys.begin(), p.rkeys.end(), rkey) == p.rkeys.end())
    return op.finish(errc::peer_lost, "rank " + std::to_string(options.rank) + ": " + describe(op) +
                                          ": its window is gone with its endpoint");
  ucp_request_param_t done{};
  done.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  done.cb.send = &ucx_engine::on_send_done;
  done.user_data = &op;
  if (!put) return track(op, ucp_get_nbx(ep, op.data, op.bytes, remote, rkey, &done));
  ucp_request_param_t quiet{};  // released by UCX when done; the flush reports
  const ucs_status_ptr_t r = ucp_put_nbx(ep, op.data, op.bytes, remote, rkey, &quiet);
  if (UCS_PTR_IS_ERR(r)) return track(op, r);
  if (r) ucp_request_free(r);
  track(op, ucp_ep_flush_nbx(ep, &done));
}

}  // namespace gradwire::transport::detail
