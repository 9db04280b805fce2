// The survivors' agreement on the next view after a loss (docs/elastic.md §2), with no server.
//
// Every member of view e that is not suspected floods what it knows: the members it
// suspects (lost by the transport, silent past the timeout, or suspected by another) and
// each member's report (steps applied). Rounds repeat until one in which this rank's
// suspects did not grow and every member it heard sent exactly its own set (round 1 at the
// earliest: round 0's proposals may be stale). Sets only grow, so that takes at most n + 1
// rounds (two, when every survivor saw the loss itself).
// The next view is view e without the suspects, and it stands only if it keeps at least
// min_replicas ranks and a strict majority of view e, unless every rank it drops is gone
// for sure (concepts::certain_loss_transport: a closed connection, its own abort; not a
// silence): of two sides of a partition, at most one goes on, while a job of two survives
// a kill. A rank that finds itself suspected learns it from the flood and fails.
//
// Joins ride the same agreement (docs/elastic.md §3): a member that applied a step whose
// sums say every member has a replacement's join request enters it with that rank among its
// admits; the admits flood like the suspects, and the next view takes them in only if it
// drops nobody and every member reports the same steps applied (a join at a clean step
// boundary; otherwise the view only shrinks and the replacement is counted again later),
// the lowest admitted rank alone per agreement.
//
// A member the next view drops for its silence (not gone for sure: a stopped process, a
// partition) is told so by each survivor, a one-byte notice on a tag of its own that every
// member listens on from the view's start: resumed, it fails with peer_lost instead of
// taking the others' closed connections (they finished meanwhile) for losses and going on
// alone.
//
// Round 0's receives are posted when the view begins (view_agreement's constructor), so
// that a member's proposal interrupts this rank's waits in the view's collectives
// (view_transport::watch_proposals): a survivor learns of a loss it cannot see itself.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../clock.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "view.hpp"

namespace gradwire::transport {

// What a member says of itself in the agreement: how many steps it has applied, and the
// size of the view whose sums its last applied step used (its scale's denominator).
struct member_report {
  std::uint64_t applied = 0;
  std::uint32_t denominator = 0;
  friend bool operator==(const member_report&, const member_report&) = default;
};

// The agreement's outcome, the same on every member of the next view.
struct next_view {
  view members;
  std::vector<int> dropped;              // job ranks of the previous view left out, ascending
  std::vector<member_report> reports;    // one per member of the next view, in its order
  std::vector<int> joined;               // job ranks taken in (replacements), ascending
};

struct view_change_options {
  int min_replicas = 1;
  std::chrono::milliseconds timeout{30000};  // for each round's messages
};

template <class Tr>
  requires concepts::multiplexing_transport<Tr> && concepts::loss_tolerant_transport<Tr>
class view_agreement {
 public:
  using request = typename Tr::request;
  static constexpr std::size_t entry_bytes = 16;  // per member: suspected, known, gone, pad, denominator, applied
  static constexpr std::chrono::milliseconds poll{20};

  // Posts round 0's receives from every other member of `current` (the proposals).
  view_agreement(Tr& base, view current)
      : view_(std::move(current)), me_(view_.position_of(base.rank())), world_(static_cast<std::size_t>(base.size())) {
    if (me_ < 0)
      throw error(errc::invalid_argument, "view_agreement: rank " + std::to_string(base.rank()) +
                                              " is not a member of view " + std::to_string(view_.epoch));
    const std::size_t n = static_cast<std::size_t>(view_.size());
    proposals_.resize(n);
    proposal_bytes_.assign(n, std::vector<std::byte>(message_bytes()));
    for (std::size_t p = 0; p < n; ++p)
      if (static_cast<int>(p) != me_)
        proposals_[p] = base.async_recv(view_.members[p], tag(0), std::span(proposal_bytes_[p]));
    outcome_.assign(n, outcome::pending);
    left_out_.resize(n);
    left_out_bytes_.assign(n, std::byte{0});
    for (std::size_t p = 0; p < n; ++p)
      if (static_cast<int>(p) != me_)
        left_out_[p] = base.async_recv(view_.members[p], tag(left_out_round), std::span(&left_out_bytes_[p], 1));
    for (auto& r : left_out_)  // first: a rank left out learns it before it reads a proposal
      if (r) watched_.push_back(&*r);
    for (auto& r : proposals_)
      if (r) watched_.push_back(&*r);
  }
  view_agreement(const view_agreement&) = delete;
  view_agreement& operator=(const view_agreement&) = delete;

  const transport::view& current() const noexcept { return view_; }

  // Whether a member has proposed the next view (its round-0 message arrived) or told this
  // rank that the next view leaves it out (agree() then says so): one look at both, which
  // a view_transport takes between the slices of every wait. A round-0 receive that failed
  // instead (the member finished, said goodbye, or was lost) is set aside: a member that
  // finished training is not a proposal, and a lost one is the transport's to report.
  bool proposed(Tr& base) {
    const time_source time = concepts::time_of(base);
    if (told_) return true;
    while (!watched_.empty()) {
      std::size_t i = 0;
      try {
        i = base.wait_any(std::span<request* const>(watched_), time.now());
      } catch (const error& e) {
        if (e.kind() != errc::timeout) throw;
        return false;
      }
      request* const r = watched_[i];
      watched_.erase(watched_.begin() + static_cast<std::ptrdiff_t>(i));
      if (const auto notice = notice_position(r)) {
        if (read_notice(base, *notice, time.now())) return true;
        continue;
      }
      const std::size_t p = position_of_request(r);
      try {
        base.wait(*proposals_[p], time.now());
        outcome_[p] = outcome::received;
        return true;
      } catch (const error& e) {
        if (e.kind() != errc::peer_lost) throw;
        outcome_[p] = outcome::failed;
      }
    }
    return false;
  }
  // For view_transport::watch_proposals.
  static bool proposed_in(void* self, Tr& base) { return static_cast<view_agreement*>(self)->proposed(base); }

  // Runs the agreement (every surviving member calls it once the view's step failed, or
  // once a step's sums admit a replacement: `admits`, job ranks outside the view).
  // Throws peer_lost when this rank is left out, or when the next view would keep fewer
  // than min_replicas ranks or no strict majority of this one.
  next_view agree(Tr& base, member_report mine, const view_change_options& options, std::span<const int> admits = {}) {
    const std::size_t n = static_cast<std::size_t>(view_.size());
    const auto me = static_cast<std::size_t>(me_);
    std::vector<std::uint8_t> suspected(n, 0), known(n, 0), gone(n, 0), admit(world_, 0);
    for (int r : admits) {
      if (r < 0 || static_cast<std::size_t>(r) >= world_ || view_.position_of(r) >= 0)
        throw error(errc::invalid_argument, "view_agreement: rank " + std::to_string(r) +
                                                " cannot join view " + std::to_string(view_.epoch) +
                                                " (not a job rank outside it)");
      admit[static_cast<std::size_t>(r)] = 1;
    }
    std::vector<member_report> reports(n);
    known[me] = 1;
    reports[me] = mine;
    // Before this rank sends anything: a stopped rank's first write to a survivor that has
    // finished meanwhile fails, and closes the connection with the notice in it unread.
    throw_if_left_out(base, poll);
    suspect_lost(base, suspected, gone);

    for (std::uint32_t round = 0;; ++round) {
      if (round > n + 1)
        throw error(errc::protocol, "view change from view " + std::to_string(view_.epoch) + ": no agreement after " +
                                        std::to_string(round) + " rounds (a member keeps changing its suspects)");
      const std::vector<std::uint8_t> before = suspected, before_gone = gone, before_admit = admit;
      const std::vector<std::byte> message = encode(suspected, known, gone, admit, reports);
      std::vector<std::size_t> listen;
      for (std::size_t p = 0; p < n; ++p)
        if (p != me && !suspected[p]) listen.push_back(p);

      std::vector<request> sends;
      for (std::size_t p : listen) sends.push_back(base.async_send(view_.members[p], tag(round), std::span(message)));
      std::vector<std::vector<std::byte>> heard_bytes;
      std::vector<std::optional<request>> fresh(n);
      if (round > 0) {
        heard_bytes.assign(n, std::vector<std::byte>(message_bytes()));
        for (std::size_t p : listen) fresh[p] = base.async_recv(view_.members[p], tag(round), std::span(heard_bytes[p]));
      }
      auto receive_of = [&](std::size_t p) -> request& { return round == 0 ? *proposals_[p] : *fresh[p]; };
      auto bytes_of = [&](std::size_t p) -> std::span<const std::byte> {
        return round == 0 ? std::span<const std::byte>(proposal_bytes_[p]) : std::span<const std::byte>(heard_bytes[p]);
      };

      bool all_equal = true;
      std::vector<std::size_t> waiting;
      for (std::size_t p : listen) {
        if (round == 0 && outcome_[p] == outcome::failed) {
          suspected[p] = 1;  // it finished or was lost before the agreement began
        } else if (round == 0 && outcome_[p] == outcome::received) {
          all_equal = merge(p, bytes_of(p), before, before_gone, before_admit, suspected, known, gone, admit, reports) &&
                    all_equal;
        } else {
          waiting.push_back(p);
        }
      }
      const time_source time = concepts::time_of(base);
      const deadline until = time.deadline_after(options.timeout);
      while (!waiting.empty()) {
        throw_if_left_out(base);
        suspect_lost(base, suspected, gone);  // a member lost meanwhile: stop waiting for it
        std::erase_if(waiting, [&](std::size_t q) { return suspected[q] != 0; });
        if (waiting.empty()) break;
        std::vector<request*> pending;
        for (std::size_t p : waiting) pending.push_back(&receive_of(p));
        std::size_t got = 0;
        try {
          got = base.wait_any(std::span<request* const>(pending), std::min(until, time.deadline_after(poll)));
        } catch (const error& e) {
          if (e.kind() != errc::timeout) throw;
          if (time.now() >= until) {  // silent past the timeout: suspected
            for (std::size_t p : waiting) suspected[p] = 1;
            waiting.clear();
          }
          continue;
        }
        const std::size_t p = waiting[got];
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(got));
        try {
          base.wait(receive_of(p), until);
        } catch (const error& e) {
          if (e.kind() != errc::peer_lost) throw;
          suspected[p] = 1;
          continue;
        }
        if (round == 0) outcome_[p] = outcome::received;
        all_equal = merge(p, bytes_of(p), before, before_gone, before_admit, suspected, known, gone, admit, reports) &&
                    all_equal;
      }
      for (auto& s : sends) {
        try {
          base.wait(s, until);
        } catch (const error& e) {
          if (e.kind() != errc::peer_lost) throw;
        }
      }
      // Round 0's messages are proposals, sent when each member entered: one that entered
      // long before this rank (this rank was stopped) may since have suspected it. Deciding
      // only after a round of fresh messages lets such a rank find out, instead of deciding
      // a view the others never form.
      if (round > 0 && all_equal && suspected == before && gone == before_gone && admit == before_admit) {
        next_view next = decide(suspected, gone, admit, reports, options);
        tell_left_out(base, suspected, gone, time);
        return next;
      }
    }
  }

 private:
  static constexpr std::uint32_t left_out_round = 0xFFFF;  // the notice's tag (rounds stop at n + 1)

  // Whether a survivor told this rank that the next view leaves it out (reading what has
  // arrived for up to `look`).
  bool told_left_out(Tr& base, std::chrono::milliseconds look = std::chrono::milliseconds(0)) {
    if (told_) return true;
    const time_source time = concepts::time_of(base);
    const deadline until = time.deadline_after(look);
    for (;;) {
      std::vector<request*> pending;
      std::vector<std::size_t> at;
      for (std::size_t p = 0; p < left_out_.size(); ++p)
        if (left_out_[p]) {
          pending.push_back(&*left_out_[p]);
          at.push_back(p);
        }
      if (pending.empty()) return false;
      std::size_t i = 0;
      try {
        i = base.wait_any(std::span<request* const>(pending), until);
      } catch (const error& e) {
        if (e.kind() != errc::timeout) throw;
        return false;  // nothing yet
      }
      if (read_notice(base, at[i], until)) return true;
    }
  }
  // Finishes the notice receive from position p, which has completed: true if the notice
  // came; otherwise that member finished or was lost, and no notice will come from it.
  bool read_notice(Tr& base, std::size_t p, deadline until) {
    try {
      base.wait(*left_out_[p], until);
      told_ = true;
      return true;
    } catch (const error&) {
      std::erase(watched_, &*left_out_[p]);
      left_out_[p].reset();
      return false;
    }
  }
  std::optional<std::size_t> notice_position(const request* r) const {
    for (std::size_t p = 0; p < left_out_.size(); ++p)
      if (left_out_[p] && &*left_out_[p] == r) return p;
    return std::nullopt;
  }
  void throw_if_left_out(Tr& base, std::chrono::milliseconds look = std::chrono::milliseconds(0)) {
    if (told_left_out(base, look))
      throw error(errc::peer_lost, "rank " + std::to_string(view_.members[static_cast<std::size_t>(me_)]) +
                                       " was left out of view " + std::to_string(view_.epoch + 1) +
                                       ": the others went on without it (it was silent past the timeout: stopped, "
                                       "or cut off); it stops");
  }
  // Each member the next view drops for a silence hears it (a moment's wait for each: a
  // stopped process's kernel still takes the byte).
  void tell_left_out(Tr& base, const std::vector<std::uint8_t>& suspected, const std::vector<std::uint8_t>& gone,
                     const time_source& time) {
    static constexpr std::byte out{1};
    for (std::size_t p = 0; p < suspected.size(); ++p) {
      if (!suspected[p] || gone[p] || static_cast<int>(p) == me_) continue;
      try {
        auto r = base.async_send(view_.members[p], tag(left_out_round), std::span(&out, 1));
        base.wait(r, time.deadline_after(std::chrono::milliseconds(200)));
      } catch (const error&) {  // lost meanwhile, or too busy to take it: it finds out otherwise
      }
    }
  }

  // Per member an entry; then one byte per job rank: whether it is admitted.
  std::size_t message_bytes() const noexcept { return static_cast<std::size_t>(view_.size()) * entry_bytes + world_; }

  std::uint64_t tag(std::uint32_t round) const noexcept {
    return view_change_tag_base | (std::uint64_t{(view_.epoch + 1) & 0xFFFFFFu} << 16) | (round & 0xFFFFu);
  }

  // The members the transport has lost are suspects; those gone for sure are marked so.
  void suspect_lost(Tr& base, std::vector<std::uint8_t>& suspected, std::vector<std::uint8_t>& gone) const {
    for (int lost : base.lost_peers())
      if (const int q = view_.position_of(lost); q >= 0) suspected[static_cast<std::size_t>(q)] = 1;
    if constexpr (concepts::certain_loss_transport<Tr>)
      for (int r : base.gone_peers())
        if (const int q = view_.position_of(r); q >= 0) gone[static_cast<std::size_t>(q)] = 1;
  }

  std::vector<std::byte> encode(const std::vector<std::uint8_t>& suspected, const std::vector<std::uint8_t>& known,
                                const std::vector<std::uint8_t>& gone, const std::vector<std::uint8_t>& admit,
                                const std::vector<member_report>& reports) const {
    std::vector<std::byte> out(message_bytes());
    for (std::size_t p = 0; p < suspected.size(); ++p) {
      std::byte* e = out.data() + p * entry_bytes;
      e[0] = std::byte{suspected[p]};
      e[1] = std::byte{known[p]};
      e[2] = std::byte{gone[p]};
      std::memcpy(e + 4, &reports[p].denominator, 4);
      std::memcpy(e + 8, &reports[p].applied, 8);
    }
    for (std::size_t r = 0; r < world_; ++r) out[suspected.size() * entry_bytes + r] = std::byte{admit[r]};
    return out;
  }

  // Folds member p's message into what this rank knows; returns whether p's suspects, gone
  // marks and admits were exactly this rank's at the round's start.
  bool merge(std::size_t p, std::span<const std::byte> bytes, const std::vector<std::uint8_t>& before,
             const std::vector<std::uint8_t>& before_gone, const std::vector<std::uint8_t>& before_admit,
             std::vector<std::uint8_t>& suspected, std::vector<std::uint8_t>& known, std::vector<std::uint8_t>& gone,
             std::vector<std::uint8_t>& admit, std::vector<member_report>& reports) const {
    bool equal = true;
    for (std::size_t r = 0; r < world_; ++r) {
      const auto a = std::to_integer<std::uint8_t>(bytes[suspected.size() * entry_bytes + r]);
      if (a > 1 || (a && view_.position_of(static_cast<int>(r)) >= 0))
        throw error(errc::protocol, "view change from view " + std::to_string(view_.epoch) + ": rank " +
                                        std::to_string(view_.members[p]) + " sent a malformed admit of rank " +
                                        std::to_string(r));
      equal = equal && a == before_admit[r];
      admit[r] |= a;
    }
    for (std::size_t q = 0; q < suspected.size(); ++q) {
      const std::byte* e = bytes.data() + q * entry_bytes;
      const auto s = std::to_integer<std::uint8_t>(e[0]), k = std::to_integer<std::uint8_t>(e[1]),
                 g = std::to_integer<std::uint8_t>(e[2]);
      if (s > 1 || k > 1 || g > s)
        throw error(errc::protocol, "view change from view " + std::to_string(view_.epoch) + ": rank " +
                                        std::to_string(view_.members[p]) + " sent a malformed proposal");
      if (s && q == static_cast<std::size_t>(me_))
        throw error(errc::peer_lost, "rank " + std::to_string(view_.members[me_]) + " was left out of view " +
                                         std::to_string(view_.epoch + 1) + ": rank " + std::to_string(view_.members[p]) +
                                         " suspects it (silent past the timeout, or cut off); it stops");
      equal = equal && s == before[q] && g == before_gone[q];
      suspected[q] |= s;
      gone[q] |= g;
      if (k && !known[q]) {
        known[q] = 1;
        std::memcpy(&reports[q].denominator, e + 4, 4);
        std::memcpy(&reports[q].applied, e + 8, 8);
      }
    }
    return equal;
  }

  next_view decide(const std::vector<std::uint8_t>& suspected, const std::vector<std::uint8_t>& gone,
                   const std::vector<std::uint8_t>& admit, const std::vector<member_report>& reports,
                   const view_change_options& options) const {
    next_view next;
    next.members.epoch = view_.epoch + 1;
    for (std::size_t p = 0; p < suspected.size(); ++p) {
      if (suspected[p]) {
        next.dropped.push_back(view_.members[p]);
      } else {
        next.members.members.push_back(view_.members[p]);
        next.reports.push_back(reports[p]);
      }
    }
    const int kept = next.members.size(), had = view_.size();
    auto lost_words = [&] {
      std::string s;
      for (int r : next.dropped) s += (s.empty() ? "rank " : ", rank ") + std::to_string(r);
      return s;
    };
    if (kept < options.min_replicas)
      throw error(errc::peer_lost, "elastic: lost " + lost_words() + "; " + std::to_string(kept) + " of view " +
                                       std::to_string(view_.epoch) + "'s " + std::to_string(had) +
                                       " ranks remain, fewer than min_replicas = " + std::to_string(options.min_replicas));
    bool all_gone = true;  // every rank dropped is gone for sure: no other side can go on
    for (std::size_t p = 0; p < suspected.size(); ++p) all_gone = all_gone && (!suspected[p] || gone[p]);
    if (2 * kept <= had && !all_gone)
      throw error(errc::peer_lost, "elastic: lost " + lost_words() + "; " + std::to_string(kept) + " of view " +
                                       std::to_string(view_.epoch) + "'s " + std::to_string(had) +
                                       " ranks remain, not a strict majority, and not every rank lost is gone for sure "
                                       "(silent, not closed): the other side of a partition may go on, so this side "
                                       "stops (docs/elastic.md)");
    // Replacements enter only at a clean step boundary: nobody dropped, every member at the
    // same step (the joiners' reports say that step too).
    const bool level = std::all_of(next.reports.begin(), next.reports.end(),
                                   [&](const member_report& r) { return r.applied == next.reports.front().applied; });
    // One at a time: two replacements joining at the same moment refuse each other's hello
    // (neither has the other's link to take back), so two admitted together could not reach
    // each other.
    if (next.dropped.empty() && level)
      for (std::size_t r = 0; r < world_; ++r) {
        if (!admit[r]) continue;
        const int rank = static_cast<int>(r);
        const auto at = std::lower_bound(next.members.members.begin(), next.members.members.end(), rank);
        const member_report level_report = next.reports.front();
        next.reports.insert(next.reports.begin() + (at - next.members.members.begin()), level_report);
        next.members.members.insert(at, rank);
        next.joined.push_back(rank);
        break;
      }
    return next;
  }

  enum class outcome : std::uint8_t { pending, received, failed };

  std::size_t position_of_request(const request* r) const {
    std::size_t p = 0;
    while (!proposals_[p] || &*proposals_[p] != r) ++p;
    return p;
  }

  view view_;
  int me_;
  std::size_t world_;  // job ranks (the admits' bitmap)
  std::vector<std::optional<request>> proposals_;
  std::vector<outcome> outcome_;
  std::vector<std::vector<std::byte>> proposal_bytes_;
  std::vector<request*> watched_;  // the notices and proposals not yet read, for proposed()
  std::vector<std::optional<request>> left_out_;  // each member's notice that this rank is out
  bool told_ = false;                             // a notice came
  std::vector<std::byte> left_out_bytes_;
};

}  // namespace gradwire::transport
