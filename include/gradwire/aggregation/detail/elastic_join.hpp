// Joins of an elastic all-reduce: a lost rank's replacement asks, the members let it in at a step
// boundary, and it takes the model's state from them (docs/elastic.md §3).
//
// - The request: after a view drops rank r, every member takes r's replacement back
//   (concepts::rejoinable_transport::allow_rejoin) and keeps a receive posted for its join
//   request (join_listener). The replacement sends one to every peer it reaches.
// - The admission rides the step's own all-reduce (elastic_all_reduce.hpp): a control slot
//   per job rank, 1 where this member holds r's request; a slot that sums to the view's size
//   means every member holds it, and every member knows that from the same sums. The
//   members then run the view agreement with r among its admits (view_change.hpp), which
//   takes r in only at a clean step boundary.
// - The welcome: every old member of the new view sends r the same view and where training
//   stands (steps applied, the last step's denominator) and the training loop's bytes
//   (on_join); r takes the first (a member lost meanwhile does not leave it waiting): enter,
//   the replacement's side. Then the state (transfer_state, state_roles): parameters,
//   optimizer buffers and counters, cut in chunks that the old members send at once, each
//   its share, all in flight together.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../../clock.hpp"
#include "../../collective/communicator.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../support/fnv1a.hpp"
#include "../../transport/view.hpp"

namespace gradwire::aggregation::detail {

inline constexpr std::uint64_t join_request_tag = transport::join_tag_base | 1;
inline constexpr std::uint64_t welcome_tag = transport::join_tag_base | 2;
inline constexpr std::uint64_t loop_state_tag = transport::join_tag_base | 3;  // the training loop's bytes (on_join)
inline constexpr std::uint64_t max_loop_state_bytes = std::uint64_t{1} << 32;

// What a replacement's model must share with the members' for their state to fit it: the
// element size and every tensor's element count, in order (a hash: the welcome carries it).
inline std::uint64_t model_fingerprint(std::size_t element_bytes, const std::vector<std::size_t>& sizes) {
  std::vector<std::uint64_t> words{element_bytes, sizes.size()};
  words.insert(words.end(), sizes.begin(), sizes.end());
  return support::fnv1a().add(std::as_bytes(std::span(words))).value();
}
inline constexpr std::uint64_t join_word = 0x6777'6a6f'696e'0001ULL;  // "gwjoin", version 1: both messages start so

// What the first old member tells a replacement: the view it enters and where training stands.
struct welcome {
  transport::view members;        // the view the replacement enters
  std::vector<int> joined;        // the replacements it takes in (this one among them), ascending
  std::uint64_t applied = 0;      // steps applied: the schedule's and the data's position
  std::uint32_t denominator = 0;  // the size of the view the last step summed
  std::uint64_t loop_state = 0;   // bytes of the training loop's state that follow (on_join)
  std::uint64_t model = 0;        // the members' model_fingerprint: a replacement checks its own

  // Fixed size per job (the replacement posts its receive before it knows the view): word,
  // epoch, member count, applied, denominator, joined count, loop state bytes, model, then
  // `world` slots of members and `world` of joined.
  static constexpr std::size_t header = 48;
  static std::size_t bytes(int world) { return header + 8 * static_cast<std::size_t>(world); }

  std::vector<std::byte> encode(int world) const {
    std::vector<std::byte> out(bytes(world));
    const auto count = static_cast<std::uint32_t>(members.size()), joining = static_cast<std::uint32_t>(joined.size());
    std::memcpy(out.data(), &join_word, 8);
    std::memcpy(out.data() + 8, &members.epoch, 4);
    std::memcpy(out.data() + 12, &count, 4);
    std::memcpy(out.data() + 16, &applied, 8);
    std::memcpy(out.data() + 24, &denominator, 4);
    std::memcpy(out.data() + 28, &joining, 4);
    std::memcpy(out.data() + 32, &loop_state, 8);
    std::memcpy(out.data() + 40, &model, 8);
    const std::size_t w = static_cast<std::size_t>(world);
    for (std::size_t i = 0; i < members.members.size(); ++i)
      std::memcpy(out.data() + header + 4 * i, &members.members[i], 4);
    for (std::size_t i = 0; i < joined.size(); ++i) std::memcpy(out.data() + header + 4 * (w + i), &joined[i], 4);
    return out;
  }

  // `from`: the job rank that sent it (named in the error for a malformed one).
  static welcome decode(std::span<const std::byte> in, int world, int me, int from) {
    auto malformed = [&](const std::string& why) {
      return error(errc::protocol, "elastic: rank " + std::to_string(me) + " got a malformed welcome from rank " +
                                       std::to_string(from) + ": " + why);
    };
    if (in.size() != bytes(world)) throw malformed("its size");
    std::uint64_t word = 0;
    std::uint32_t count = 0, joining = 0;
    welcome w;
    std::memcpy(&word, in.data(), 8);
    std::memcpy(&w.members.epoch, in.data() + 8, 4);
    std::memcpy(&count, in.data() + 12, 4);
    std::memcpy(&w.applied, in.data() + 16, 8);
    std::memcpy(&w.denominator, in.data() + 24, 4);
    std::memcpy(&joining, in.data() + 28, 4);
    std::memcpy(&w.loop_state, in.data() + 32, 8);
    std::memcpy(&w.model, in.data() + 40, 8);
    if (word != join_word) throw malformed("not a gradwire welcome, or another version");
    if (w.loop_state > max_loop_state_bytes) throw malformed(std::to_string(w.loop_state) + " bytes of loop state");
    if (count < 2 || count > static_cast<std::uint32_t>(world) || joining < 1 || joining >= count)
      throw malformed(std::to_string(count) + " members, " + std::to_string(joining) + " of them joining");
    auto ranks = [&](std::size_t first, std::uint32_t n, std::vector<int>& out) {
      for (std::uint32_t i = 0; i < n; ++i) {
        int r = 0;
        std::memcpy(&r, in.data() + header + 4 * (first + i), 4);
        if (r < 0 || r >= world || (!out.empty() && r <= out.back())) throw malformed("its ranks are not ascending job ranks");
        out.push_back(r);
      }
    };
    ranks(0, count, w.members.members);
    ranks(static_cast<std::size_t>(world), joining, w.joined);
    const bool holds_me = std::find(w.joined.begin(), w.joined.end(), me) != w.joined.end();
    const bool sender_old = w.members.position_of(from) >= 0 && std::find(w.joined.begin(), w.joined.end(), from) == w.joined.end();
    if (!holds_me || !sender_old) throw malformed("it does not take this rank in, from a member");
    for (int r : w.joined)
      if (w.members.position_of(r) < 0) throw malformed("a joining rank outside its view");
    return w;
  }
};

// A member's posted receives for replacements' join requests, one per job rank it listens for.
// (Instantiated over concepts::rejoinable_transport only: elastic_all_reduce uses it under
// `if constexpr`.)
template <class Tr>
class join_listener {
 public:
  explicit join_listener(int world)
      : requests_(static_cast<std::size_t>(world)), words_(static_cast<std::size_t>(world)), asked_(requests_.size(), 0) {}

  // Rank r left the view: take its replacement back, and listen for its request.
  void listen(Tr& base, int r) {
    base.allow_rejoin(r);
    post(base, r);
  }

  // Whether r's replacement has asked to join (its request arrived, and was not yet
  // admitted) and is still linked. One that asked and was lost since (or before its request
  // was read) is not counted: the members would take in a process that is gone, and a view
  // would drop it again. The next replacement's request is listened for.
  bool asked(Tr& base, int r) {
    auto& req = requests_[static_cast<std::size_t>(r)];
    if (!req) return false;
    if (!asked_[static_cast<std::size_t>(r)] && !read_request(base, r)) return false;
    const std::vector<int> lost = base.lost_peers();
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) return true;
    post(base, r);
    return false;
  }

  // r entered a view: stop listening for it (until it leaves one again).
  void admitted(int r) {
    requests_[static_cast<std::size_t>(r)].reset();
    asked_[static_cast<std::size_t>(r)] = 0;
  }

 private:
  // Whether r's request has arrived (asked_ then holds it).
  bool read_request(Tr& base, int r) {
    auto& req = requests_[static_cast<std::size_t>(r)];
    const time_source time = concepts::time_of(base);
    typename Tr::request* one[] = {&*req};
    try {
      base.wait_any(std::span<typename Tr::request* const>(one), time.now());
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      return false;  // not yet
    }
    // A replacement is never a reason for a member to fail: one lost before its request
    // came, or whose request is not this version's (another size: mismatch; another word),
    // is not counted, and the member listens for the next.
    try {
      base.wait(*req, time.now());
    } catch (const error&) {
      post(base, r);
      return false;
    }
    if (words_[static_cast<std::size_t>(r)] != join_word) {
      post(base, r);
      return false;
    }
    asked_[static_cast<std::size_t>(r)] = 1;
    return true;
  }

  void post(Tr& base, int r) {
    const auto i = static_cast<std::size_t>(r);
    asked_[i] = 0;
    requests_[i] = base.async_recv(r, join_request_tag, std::as_writable_bytes(std::span(&words_[i], 1)));
  }

  std::vector<std::optional<typename Tr::request>> requests_;
  std::vector<std::uint64_t> words_;
  std::vector<char> asked_;  // its request arrived (the receive is spent)
};

// The replacement's side: a join request to every peer it reaches (a lost one is skipped).
template <class Tr>
void ask_to_join(Tr& base, deadline until) {
  std::vector<typename Tr::request> sends;
  const auto word = std::as_bytes(std::span(&join_word, 1));
  std::vector<int> lost = base.lost_peers();
  for (int p = 0; p < base.size(); ++p)
    if (p != base.rank() && std::find(lost.begin(), lost.end(), p) == lost.end())
      sends.push_back(base.async_send(p, join_request_tag, word));
  for (auto& s : sends) try {
      base.wait(s, until);
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
    }
}

// What a step that let replacements in leaves for synchronise_state: who sends the state
// and who receives it (positions in the new view).
struct state_roles {
  std::vector<int> senders, joiners;
  int first_old = -1;  // job rank of the first sender: the loop's bytes come from it

  static state_roles of(const transport::view& v, const std::vector<int>& joined) {
    state_roles t;
    for (int p = 0; p < v.size(); ++p) {
      const int r = v.members[static_cast<std::size_t>(p)];
      (std::find(joined.begin(), joined.end(), r) != joined.end() ? t.joiners : t.senders).push_back(p);
    }
    t.first_old = v.members[static_cast<std::size_t>(t.senders.front())];
    return t;
  }
};

// What a replacement takes as it enters: the first welcome, who sent it, and the training
// loop's bytes (from the first old member).
struct entry {
  welcome message;
  int sender = -1;
  state_roles roles;  // of the view it enters: who sends it the state
  std::vector<std::byte> loop_state;
};

// The replacement's side of its admission: a receive of every reachable member's welcome,
// a request to join to each, then the first welcome that comes (a member lost meanwhile
// does not leave it waiting), checked against its own model (`model`, model_fingerprint),
// and the loop's bytes. Throws peer_lost when it reaches no member or loses all it asked,
// timeout when none lets it in by `until` (saying why that may be), mismatch for another
// model (before it takes anything).
template <class Tr>
entry enter(Tr& base, std::uint64_t model, deadline until) {
  const int me = base.rank(), n = base.size();
  const std::vector<int> lost = base.lost_peers();
  std::vector<int> from;
  for (int p = 0; p < n; ++p)
    if (p != me && std::find(lost.begin(), lost.end(), p) == lost.end()) from.push_back(p);
  const std::string who = "elastic_all_reduce: rank " + std::to_string(me) + ", a replacement (GRADWIRE_REJOIN=1),";
  if (from.empty()) throw error(errc::peer_lost, who + " reaches no member of the job");
  std::vector<std::vector<std::byte>> bytes(from.size(), std::vector<std::byte>(welcome::bytes(n)));
  std::vector<typename Tr::request> receives;
  for (std::size_t i = 0; i < from.size(); ++i) receives.push_back(base.async_recv(from[i], welcome_tag, std::span(bytes[i])));
  ask_to_join(base, until);
  std::vector<typename Tr::request*> pending;
  std::vector<std::size_t> pending_at;
  for (std::size_t i = 0; i < receives.size(); ++i) {
    pending.push_back(&receives[i]);
    pending_at.push_back(i);
  }
  std::optional<welcome> w;
  int sender = -1;
  while (!w) {
    if (pending.empty()) throw error(errc::peer_lost, who + " lost every member it asked before one let it in");
    std::size_t got = 0;
    try {
      got = base.wait_any(std::span<typename Tr::request* const>(pending), until);
    } catch (const error& e) {
      if (e.kind() != errc::timeout) throw;
      std::string unreached;
      for (int p : lost) unreached += (unreached.empty() ? "" : ", ") + std::to_string(p);
      throw error(errc::timeout, who + " asked ranks it reached to join, and none let it in before the deadline: "
                                     "they admit it at a step boundary once every member holds its request" +
                                     (unreached.empty() ? std::string()
                                                        : "; it did not reach ranks " + unreached +
                                                              " (gone, a member that had not yet dropped this rank "
                                                              "and refused its replacement: start it later, "
                                                              "gradwire-run --restart-delay; or a replacement "
                                                              "of another rank joining at the same moment)"));
    }
    const std::size_t i = pending_at[got];
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(got));
    pending_at.erase(pending_at.begin() + static_cast<std::ptrdiff_t>(got));
    try {
      base.wait(receives[i], until);
    } catch (const error& e) {
      if (e.kind() != errc::peer_lost) throw;
      continue;
    }
    sender = from[i];
    w = welcome::decode(bytes[i], n, me, sender);
  }
  if (w->model != model)
    throw error(errc::mismatch, who + " holds a model that is not the members' (element size, tensor count or a "
                                      "tensor's size differs): every replica must build the same model; nothing "
                                      "was taken");
  // The loop's bytes, from the first old member (only its welcome says how many).
  state_roles roles = state_roles::of(w->members, w->joined);
  const int first_old = roles.first_old;
  if (sender != first_old) {
    const auto at = std::find(from.begin(), from.end(), first_old);
    try {
      if (at == from.end()) throw error(errc::peer_lost, "it did not reach that rank");
      const auto i = static_cast<std::size_t>(at - from.begin());
      base.wait(receives[i], until);
      std::erase(pending, &receives[i]);  // taken: not among the rest below
      w->loop_state = welcome::decode(bytes[i], n, me, first_old).loop_state;
    } catch (const error& e) {
      throw error(e.kind(), who + " could not take the training loop's state from rank " + std::to_string(first_old) +
                                ": " + e.details());
    }
  }
  entry out{*w, sender, std::move(roles), std::vector<std::byte>(static_cast<std::size_t>(w->loop_state))};
  if (!out.loop_state.empty()) {
    auto r = base.async_recv(first_old, loop_state_tag, std::span(out.loop_state));
    base.wait(r, until);
  }
  // Every old member sent its welcome at once: take the rest too (briefly), so that none is
  // left unread (UCX warns of a message nobody received when the rank ends).
  const deadline rest = std::min(until, concepts::time_of(base).deadline_after(std::chrono::seconds(1)));
  for (auto* p : pending) try {
      base.wait(*p, rest);
    } catch (const error&) {  // lost meanwhile, or slow: its welcome is not needed
    }
  return out;
}

// The model's state as the members and a replacement exchange it: segments of bytes, the
// same count and sizes on every member of the view.
inline constexpr std::size_t state_chunk_bytes = std::size_t{4} << 20;

// Every old member (`senders`, positions in the view) sends its share of the chunks of
// `segments` to every joiner (`joiners`, positions); each joiner receives every chunk in
// place. Chunk j goes from senders[j % senders.size()]: a joiner takes the state from all
// old members at once. Collective over the view: every member calls it.
template <class VTr>
void transfer_state(collective::communicator<VTr>& comm, std::span<const std::span<std::byte>> segments,
                    const std::vector<int>& senders, const std::vector<int>& joiners, deadline until) {
  std::size_t total = 0;
  for (auto s : segments) total += s.size();
  // At most 2^16 chunks (a tag's step field; checked below: segments round up), at least
  // state_chunk_bytes each.
  const std::size_t chunk = std::max(state_chunk_bytes, (total + 0xFFFF) / 0x10000);
  std::size_t chunks = 0;
  for (auto s : segments) chunks += (s.size() + chunk - 1) / chunk;
  if (chunks > 0x10000)
    throw error(errc::invalid_argument, "elastic: a state of " + std::to_string(segments.size()) +
                                            " segments is more than 65536 chunks to hand over (fewer, larger tensors)");
  const std::uint64_t sequence = comm.begin_operation();
  auto& t = comm.transport();
  const int me = comm.rank();
  const auto mine = std::find(senders.begin(), senders.end(), me);
  const bool joining = std::find(joiners.begin(), joiners.end(), me) != joiners.end();
  std::vector<typename VTr::request> requests;
  std::uint32_t j = 0;
  for (auto segment : segments)
    for (std::size_t at = 0; at < segment.size(); at += chunk, ++j) {
      const auto piece = segment.subspan(at, std::min(chunk, segment.size() - at));
      const int from = senders[j % senders.size()];
      const std::uint64_t tag = collective::make_tag(sequence, j);
      if (joining) {
        requests.push_back(t.async_recv(from, tag, piece));
      } else if (mine != senders.end() && *mine == from) {
        for (int to : joiners) requests.push_back(t.async_send(to, tag, std::span<const std::byte>(piece)));
      }
    }
  for (auto& r : requests) t.wait(r, until);
}

}  // namespace gradwire::aggregation::detail
