// ucx's receive path: tagged receives matched by UCX, sizes checked on completion.
#pragma once

#include <string>

#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_engine::on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<ucx_op*>(user_data);
  op->request = nullptr;
  ucp_request_free(request);
  finish_receive(op, status, info->length);
}

GRADWIRE_DECL void ucx_engine::finish_receive(ucx_op* op, ucs_status_t status, std::size_t length) {
  if (status == UCS_ERR_MESSAGE_TRUNCATED)
    op->finish(errc::mismatch, "message size mismatch: rank " + std::to_string(op->peer) + " sent more than the " +
                                   std::to_string(op->bytes) + " bytes (tag " + std::to_string(op->tag) +
                                   ") that this rank expected");
  else if (status == UCS_ERR_CANCELED)
    return;  // see on_send_done
  else if (status != UCS_OK)
    op->finish(errc::peer_lost, std::string("UCX receive failed: ") + ucx_status_text(status));
  else if (length != op->bytes)
    op->finish(errc::mismatch, "message size mismatch: rank " + std::to_string(op->peer) + " sent " +
                                   std::to_string(length) + " bytes (tag " + std::to_string(op->tag) +
                                   ") but this rank expected " + std::to_string(op->bytes));
  else
    op->finish();
}

GRADWIRE_DECL void ucx_engine::post_recv(ucx_op& op) {
  if (peer_unavailable(op)) return;
  if (peers[op.peer].state.finished) {
    // It finished: only a message already here can match.
    ucp_tag_recv_info_t info;
    if (!ucp_tag_probe_nb(worker.get(), ucx_tag::data(op.peer, op.tag), ucx_tag::full_mask, 0, &info))
      return op.finish(errc::peer_lost, finished_message(options.rank, op.peer));
  }
  ucp_request_param_t p{};
  // Always through the callback, which reports the length that arrived. (Only the
  // length: UCX 1.13 leaves sender_tag unset when a receive matches a message that
  // arrived first, so nothing here relies on it.)
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &ucx_engine::on_recv_done;
  p.user_data = &op;
  const ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), op.data, op.bytes,
                                              ucx_tag::data(op.peer, op.tag), ucx_tag::full_mask, &p);
  track(op, r);
}

}  // namespace gradwire::transport::detail
