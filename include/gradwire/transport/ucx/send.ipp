// ucx's send path: tagged sends on the small or the bulk endpoint, and how UCX hands an op back.
#pragma once

#include <string>

#include "engine.hpp"

namespace gradwire::transport::detail {

// Finishes the op at once if its peer cannot take part. A peer that finished sends
// nothing more, but what it sent before its goodbye has arrived and may still match
// a receive (post_recv checks), so only sends to it are refused outright.
GRADWIRE_DECL bool ucx_engine::peer_unavailable(ucx_op& op) {
  const auto& p = peers[op.peer];
  // A receive from a lost peer that may rejoin waits for the replacement (or its deadline).
  if (p.state.lost() && !(p.rejoinable && !op.is_send)) return op.finish(errc::peer_lost, p.state.lost_reason), true;
  if (p.state.finished && op.is_send) return op.finish(errc::peer_lost, finished_message(options.rank, op.peer)), true;
  return false;
}

GRADWIRE_DECL void ucx_engine::on_send_done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<ucx_op*>(user_data);
  op->request = nullptr;
  ucp_request_free(request);
  // Cancelled by this rank (withdraw): whoever cancelled finishes it, with its reason.
  if (status == UCS_ERR_CANCELED) return;
  if (status != UCS_OK) op->finish(errc::peer_lost, "");  // described later (why_failed)
  else op->finish();
}

GRADWIRE_DECL void ucx_engine::post_send(ucx_op& op) {
  if (peer_unavailable(op)) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &ucx_engine::on_send_done;
  p.user_data = &op;
  const bool bulk = op.bytes >= options.bulk_bytes;
  // Below bulk_bytes to a peer over shared memory: eager (see ucx_peer::eager_below_bulk).
  if (!bulk && peers[op.peer].eager_below_bulk) p.op_attr_mask |= UCP_OP_ATTR_FLAG_FAST_CMPL;
  const ucs_status_ptr_t r =
      ucp_tag_send_nbx(bulk ? peers[op.peer].bulk_ep : peers[op.peer].ep, op.data, op.bytes,
                       ucx_tag::data(options.rank, op.tag), &p);
  track(op, r);
}

GRADWIRE_DECL void ucx_engine::track(ucx_op& op, ucs_status_ptr_t r) {
  if (UCS_PTR_IS_ERR(r) && op.is_send) {
    // Its endpoint failed, and UCX may not have said so yet: the op waits for the
    // verdict on the peer (a goodbye, an abort with a reason, or its loss).
    in_flight.push_back(&op);
    broken_endpoints.emplace_back(op.peer, UCS_PTR_STATUS(r));
  } else if (UCS_PTR_IS_ERR(r)) {
    op.finish(errc::peer_lost, describe(op) + " failed: " + ucx_status_text(UCS_PTR_STATUS(r)));
  } else if (r == nullptr) {
    op.finish();  // a send that completed at once
  } else if (op.state == status::active) {
    op.request = r;
    in_flight.push_back(&op);
  }
}

}  // namespace gradwire::transport::detail
