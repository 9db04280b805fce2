// ucx after the join: a lost peer's replacement process connects again (rejoin), on both sides.
//
// The same protocol as asio_tcp's (tcp/rejoin.ipp), over UCX's own means. A UCX receive is
// posted on the worker, not on an endpoint, and matches the sender's rank in the tag: a
// receive from a lost peer that may rejoin (allow_rejoin) simply stays posted, and the
// replacement's message matches it. What must be new is the way back: the replacement
// (options.rejoin) reads every peer's latest address from the store, connects, and sends
// each a rejoin control message carrying its own worker address. A peer that takes it back
// (it allowed that rank to rejoin: a view dropped it, or an asynchronous parameter server
// lost that worker) drops what the lost process left unread, connects to the new address
// and answers rejoin_welcome; any other answers rejoin_refused with the reason. The
// replacement waits a moment for the answers (a live peer answers at once), treats the
// silent and the refusing as absent (operations with them fail with peer_lost naming why),
// and publishes its address where a later replacement of another rank finds it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../../observe/log.hpp"
#include "../../rendezvous/host_identity.hpp"
#include "../../rendezvous/store.hpp"
#include "../detail/join.hpp"
#include "engine.hpp"

namespace gradwire::transport::detail {

GRADWIRE_DECL void ucx_engine::allow_rejoin(int peer) {
  peers[peer].state.tolerated = peers[peer].rejoinable = true;
  // Receives posted from it now wait for its replacement: what the lost process left
  // unread must not match them (relink drops what arrives until then).
  if (peers[peer].state.lost()) discard_stale_messages(peer);
}

// The replacement's join: addresses from the store (rank 0's, which serves it and cannot
// rejoin), a hello to every peer, their answers, then its own address published.
GRADWIRE_DECL void ucx_engine::join_back(deadline until) {
  const int me = options.rank, n = options.size;
  if (me == 0)
    throw error(errc::config, "ucx: rank 0 cannot rejoin a job (GRADWIRE_REJOIN=1): it serves the rendezvous store; "
                              "restart the whole job (from its checkpoints)");
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()));
  };
  rendezvous::store_client store(options.store_host, options.store_port, options.job_token, left());
  std::vector<std::vector<std::byte>> addresses(static_cast<std::size_t>(n));
  addresses[me] = worker_address();
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    store.set_timeout(left());
    addresses[r] = store.get(options.store_prefix + std::to_string(r));
    check_published_address(r, addresses[r]);
  }
  const std::string identity = rendezvous::local_host_identity(options.host_id);
  topology = rendezvous::exchange_topology(store, options.store_prefix + "host/", me, n, identity, identity, left());
  peer_address(me, addresses[me]);
  post_control_receive();
  rejoining = true;
  // Hello to every peer at once: this rank's address, as a control message. A peer UCX
  // cannot reach (its process gone with its shared memory) is absent, not a failed join.
  const auto& mine = addresses[me];
  const std::uint32_t header[4] = {static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(ucx_control::rejoin), 0, 0};
  std::vector<std::byte> hello(sizeof header + mine.size());
  std::memcpy(hello.data(), header, sizeof header);
  std::memcpy(hello.data() + sizeof header, mine.data(), mine.size());
  std::vector<std::unique_ptr<ucx_op>> sends;
  auto say_hello = [&](int r) {
    auto& op = *sends.emplace_back(std::make_unique<ucx_op>());
    op.is_send = true;
    op.peer = r;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = &ucx_engine::on_send_done;
    prm.user_data = &op;
    const ucs_status_ptr_t s = ucp_tag_send_nbx(peers[r].ep, hello.data(), hello.size(), ucx_tag::control(me), &prm);
    if (UCS_PTR_IS_PTR(s)) op.request = s;
  };
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    peers[r].state.tolerated = true;  // a peer gone since must not fail this join
    try {
      peer_address(r, addresses[r]);
    } catch (const error& e) {
      mark_absent(r, e.what());
      continue;
    }
    say_hello(r);
  }
  // Live peers answer within moments (a stopped one never does): a short wait. A peer that
  // has not let the lost process go yet (it has not noticed the loss: UCX's keepalive over
  // shared memory takes about a second) asks to be asked again: so it is, until the join's
  // deadline.
  auto answered = [&] {
    for (int r = 0; r < n; ++r)
      if (r != me && peers[r].state.live() && peers[r].rejoin_answer == ucx_peer::answer::none) return false;
    return true;
  };
  try {
    deadline prompt = std::min(until, clock::now() + prompt_reply_timeout);
    for (;;) {
      progress_until(answered, prompt);
      std::vector<int> again;
      for (int r = 0; r < n; ++r)
        if (r != me && peers[r].state.live() && peers[r].rejoin_answer == ucx_peer::answer::refused &&
            peers[r].refusal_retryable)
          again.push_back(r);
      if (again.empty() || clock::now() + std::chrono::milliseconds(200) >= until) break;
      progress_until([] { return false; }, clock::now() + std::chrono::milliseconds(200));
      for (int r : again) {
        peers[r].rejoin_answer = ucx_peer::answer::none;
        say_hello(r);
      }
      prompt = std::min(until, clock::now() + prompt_reply_timeout);
    }
  } catch (...) {
    close_endpoints();  // releases the hellos still in flight before `sends` goes
    for (auto& op : sends) settle(*op);
    throw;
  }
  rejoining = false;
  joining = false;
  bool linked = false;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    auto& p = peers[r];
    if (p.rejoin_answer == ucx_peer::answer::welcome && p.state.live()) {
      p.state.tolerated = false;  // linked as at a join: its loss is the caller's to tolerate
      linked = true;
      continue;
    }
    mark_absent(r, p.rejoin_answer == ucx_peer::answer::refused ? p.refusal
                   : p.state.lost()                            ? p.state.lost_reason
                                                               : "it did not answer the hello in time");
  }
  for (auto& op : sends) {  // a send to an absent peer: its closed endpoint released it
    settle(*op);
    // One UCX still holds keeps the hello's bytes (a moved vector keeps its allocation).
    std::vector<std::byte> bytes;
    if (op->request) bytes = std::move(hello);
    keep_until_released(std::move(op), std::move(bytes));
  }
  // A peer has taken it back (proof that the process it replaces is gone): only then does
  // its address replace that process's. Its own moment for the store: a store that does
  // not answer is a warning (only later replacements need the address), not a failed join.
  if (linked) try {
      store.set_timeout(std::chrono::seconds(5));
      store.set(options.store_prefix + std::to_string(me), mine);
    } catch (const error& e) {
      observe::log_warning(me, n, "ucx: rank ", me, " (a replacement) could not publish its address; a later "
                                  "replacement of another rank will not reach it: ", e.what());
    }
}

// A replacement's hello: takes it back, or refuses with why (over an endpoint made for
// the answer alone).
GRADWIRE_DECL void ucx_engine::take_back(int peer, std::span<const std::byte> address) {
  const std::string me = "rank " + std::to_string(options.rank), who = "rank " + std::to_string(peer);
  std::string refusal;
  bool retryable = false;  // the replacement may ask again: the answer may change soon
  if (address.size() <= address_header) {
    refusal = "its hello carried no UCX address";
  } else if (std::uint32_t size = 0; std::memcpy(&size, address.data(), sizeof size), size != static_cast<std::uint32_t>(options.size)) {
    refusal = world_size_mismatch_message(static_cast<std::uint64_t>(peer), size, options.rank, options.size);
  } else if (peer == options.rank) {
    refusal = who + " is this rank";
  } else if (failed) {
    refusal = me + " has failed: " + failed->second;
  } else if (!peers[peer].rejoinable) {
    refusal = me + " does not take " + who + " back (only a view that dropped it, or an asynchronous parameter "
                   "server's servers, take a lost rank back)";
    retryable = peers[peer].state.tolerated;  // it may: a loss it tolerates, not yet dropped
  } else if (peers[peer].state.finished) {
    refusal = who + " has finished (it said goodbye): it cannot rejoin";
  } else if (!peers[peer].state.lost()) {
    // UCX matches a message by the rank in its tag: a live old process's messages would
    // reach the replacement's receives. (One that stopped is dropped once its silence
    // outlasts the stall timeout; a later replacement is taken.)
    refusal = who + " is still connected to " + me + ": are two processes running as " + who + "?";
    retryable = true;  // it may not have noticed the old process's end yet
  }
  if (!refusal.empty()) {
    const std::vector<std::byte> bytes(address.begin(), address.end());
    ucp_ep_h ep = nullptr;
    try {
      if (address.size() > address_header) ep = connect(peer, bytes, false);
    } catch (const error&) {
      return;  // nobody to tell: the replacement's own deadline tells it
    }
    answer_rejoin(peer, ep, ucx_control::rejoin_refused, refusal, retryable);
    return;
  }
  try {
    relink(peer, address);
  } catch (const error& e) {  // UCX cannot reach it: it stays lost, and its replacement hears nothing
    observe::log_warning(options.rank, options.size, "ucx: rank ", peer, "'s replacement could not be reached: ", e.what());
    return;
  }
  answer_rejoin(peer, peers[peer].ep, ucx_control::rejoin_welcome, {}, false);
  observe::log_info(options.rank, options.size, "ucx: rank ", peer, " rejoined (a replacement process)");
}

// Sends one control message on `ep` and waits briefly for it to leave. A refusal's `ep`
// was made for it, and is closed here; a welcome's is the peer's, which a send that does
// not leave cuts off.
GRADWIRE_DECL void ucx_engine::answer_rejoin(int peer, ucp_ep_h ep, ucx_control kind, const std::string& text,
                                             bool retryable) {
  if (!ep) return;
  // A refusal's cause: timeout when asking again later may succeed, config when it will not.
  const errc cause = kind == ucx_control::rejoin_refused ? (retryable ? errc::timeout : errc::config) : errc{};
  const std::uint32_t header[4] = {static_cast<std::uint32_t>(options.rank), static_cast<std::uint32_t>(kind),
                                   static_cast<std::uint32_t>(cause), 0};
  std::vector<std::byte> payload(sizeof header + std::min(text.size(), max_control_bytes - control_header_bytes));
  std::memcpy(payload.data(), header, sizeof header);
  std::memcpy(payload.data() + sizeof header, text.data(), payload.size() - sizeof header);
  auto op = std::make_unique<ucx_op>();
  op->is_send = true;
  op->peer = peer;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &ucx_engine::on_send_done;
  prm.user_data = op.get();
  const ucs_status_ptr_t s = ucp_tag_send_nbx(ep, payload.data(), payload.size(), ucx_tag::control(options.rank), &prm);
  if (UCS_PTR_IS_PTR(s)) op->request = s;
  const auto until = clock::now() + std::chrono::seconds(1);
  while (op->request && clock::now() < until)
    if (ucp_worker_progress(worker.get()) == 0) std::this_thread::yield();
  if (kind == ucx_control::rejoin_welcome) {
    if (op->request) isolate(peer, lost_peer_message(options.rank, peer, "its replacement did not take the welcome"));
  } else {
    close_endpoint(ep);  // releases a send still held
  }
  settle(*op);
  keep_until_released(std::move(op), std::move(payload));
}

// Connects `peer`'s replacement in place of the lost process; the receives posted from the
// peer meanwhile stay posted, and match the replacement's messages.
GRADWIRE_DECL void ucx_engine::relink(int peer, std::span<const std::byte> address) {
  auto& p = peers[peer];
  close_endpoint(p);
  // Reports about the old endpoints: UCX may give the new ones the same addresses.
  std::erase_if(broken_endpoints, [&](const broken_endpoint& b) { return b.peer == peer; });
  discard_stale_messages(peer);
  try {
    peer_address(peer, address);
  } catch (...) {
    close_endpoint(p);
    throw;
  }
  p.state = peer_state{};
  p.state.tolerated = p.rejoinable = true;
  p.drained_at.reset();
  p.saw_our_abort = false;
  std::erase(lost, peer);
  std::erase(gone, peer);
  ++rejoined_peers;
}

// Messages the lost process sent that nobody received (a step's pieces dropped when it
// was lost) would otherwise match the replacement's receives of the same tags.
GRADWIRE_DECL void ucx_engine::discard_stale_messages(int peer) {
  for (;;) {
    ucp_tag_recv_info_t info{};
    const ucp_tag_message_h m = ucp_tag_probe_nb(worker.get(), ucx_tag::data(peer, 0), ucx_tag::source_mask, 1, &info);
    if (!m) return;
    std::vector<std::byte> scratch(std::max<std::size_t>(info.length, 1));
    auto op = std::make_unique<ucx_op>();
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv = &ucx_engine::on_recv_done;
    prm.user_data = op.get();
    const ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker.get(), scratch.data(), info.length, m, &prm);
    if (!UCS_PTR_IS_PTR(r)) continue;
    op->request = r;
    settle(*op);  // a rendezvous from a dead process may never end: then it is kept
    keep_until_released(std::move(op), std::move(scratch));
  }
}

// A peer the replacement is not connected to: operations with it fail with `why`.
GRADWIRE_DECL void ucx_engine::mark_absent(int peer, const std::string& why) {
  auto& p = peers[peer];
  if (p.state.lost()) {
    close_endpoint(p);
    return;
  }
  isolate(peer,
          "rank " + std::to_string(options.rank) + " (a replacement process, GRADWIRE_REJOIN=1) is not linked to rank " +
              std::to_string(peer) + ": " + why);
}

}  // namespace gradwire::transport::detail
