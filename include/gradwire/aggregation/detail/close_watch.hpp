// K of N's agreement on who is in a step: the close watch (docs/elastic.md, "K of N: the close watch").
//
// N ranks, b backups. The caller's thread says when this rank's first bucket of a step is
// complete (mark_ready(step)); the communicator's thread opens each step's round (open)
// and runs it (run): it announces `in`
// to every peer when the rank is ready and the step has not closed, and closes the step
// once it has counted N - b announcements; a rank that closes without having announced
// is late and says `out` to every peer instead. Each rank sends one message, the same,
// to every peer, so once a rank holds its N - 1 messages every rank holds the same set:
// the ranks that said `in`. One decision per rank per step, taken under the mutex both
// threads take, is what makes the set the same everywhere.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../../collective/communicator.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../support/rank_condition.hpp"

namespace gradwire::aggregation::detail {

// Who is in one step, the same on every rank.
struct step_set {
  std::vector<int> in;  // ranks whose gradients the step sums, ascending
  bool self_in = false;  // this rank's own
  std::size_t size() const noexcept { return in.size(); }
};

template <class Tr>
class close_watch {
 public:
  // How often the communicator's thread looks at its own caller's readiness while peers'
  // messages are still to come (no network transport wakes a wait from another thread yet;
  // a simulated rank's does: there the caller's readiness ends the wait, at its time).
  static constexpr std::chrono::microseconds poll{200};

  // size: the ranks of the step; backups: how many may be left out (0 < backups < size);
  // time: the rank's (its two threads may be a simulated rank's virtual ones).
  close_watch(int size, int backups, time_source time = {}) : size_(size), need_(size - backups), ready_(time) {
    if (size < 2 || backups < 1 || backups >= size)
      throw error(errc::invalid_argument, "close_watch: backups = " + std::to_string(backups) + " of " +
                                              std::to_string(size) + " ranks: K of N needs 0 < backups < ranks");
  }

  // Step `step`'s round is next (the communicator's thread, before run()). A caller that
  // already marked this step ready is counted ready from the start.
  void open(std::uint64_t step) {
    const auto lock = ready_.lock(mutex_);
    current_ = step;
    opened_ = true;
    state_ = marked_ == step ? state::ready : state::open;
  }

  // The caller's thread: its first bucket of step `step` (the step its gradients were
  // computed for) is complete. Returns whether the rank is in (the round announces it,
  // or will: a round that opens already ready announces first) or late (the step closed
  // without it, or is past: drop the gradients).
  bool mark_ready(std::uint64_t step) {
    const auto lock = ready_.lock(mutex_);
    if (opened_ && step < current_) return false;
    if (!opened_ || step > current_) {  // its round has not opened yet
      marked_ = step;
      return true;
    }
    if (state_ == state::open) state_ = state::ready;
    ready_.notify_all();
    return state_ != state::late;
  }

  // The communicator's thread: one step's round, a collective operation of its own (every
  // rank runs it once per step, in the same place among its collectives).
  step_set run(collective::communicator<Tr>& comm)
    requires concepts::multiplexing_transport<Tr>
  {
    auto& t = comm.transport();
    const int me = comm.rank();
    if (comm.size() != size_)
      throw error(errc::invalid_argument, "close_watch: made for " + std::to_string(size_) + " ranks, run on " +
                                              std::to_string(comm.size()));
    const auto tag = collective::make_tag(comm.begin_operation(), 0);
    const deadline until = comm.step_deadline();
    const time_source time = comm.time();

    std::vector<int> peers;
    for (int p = 0; p < size_; ++p)
      if (p != me) peers.push_back(p);
    std::vector<std::byte> said(peers.size());  // what each peer says: 1 in, 0 out
    std::vector<typename Tr::request> receives;
    receives.reserve(peers.size());
    for (std::size_t i = 0; i < peers.size(); ++i) receives.push_back(t.async_recv(peers[i], tag, std::span(&said[i], 1)));
    std::vector<typename Tr::request*> pending;
    std::vector<std::size_t> pending_at;
    for (std::size_t i = 0; i < receives.size(); ++i) {
      pending.push_back(&receives[i]);
      pending_at.push_back(i);
    }
    // A simulated rank's caller wakes this thread's waits when it is ready: no polling.
    const bool woken = time.runs_background_inline();
    struct wake_guard {
      time_source t;
      bool on;
      ~wake_guard() {
        if (on) t.waits_end_on_signal(false);
      }
    } guard{time, woken};
    if (woken) time.waits_end_on_signal(true);
    std::byte mine{0};
    std::vector<typename Tr::request> sends;
    sends.reserve(peers.size());
    int counted = 0;  // announcements: the peers' heard so far, and this rank's own
    bool decided = false;

    for (;;) {
      if (!decided) {  // this rank's one decision: announce, or close without announcing
        auto lock = ready_.lock(mutex_);
        if (state_ == state::ready) {
          state_ = state::in;
          mine = std::byte{1};
          ++counted;
        } else if (state_ == state::open && counted >= need_) {
          state_ = state::late;
        }
        decided = state_ == state::in || state_ == state::late;
        if (!decided && pending.empty()) {
          // Every peer has spoken and this rank's readiness decides: sleep until it comes.
          if (!ready_.wait_until(lock, until, [&] { return state_ != state::open; }))
            throw error(errc::timeout, timed_out(me, peers.size(), false));
          continue;
        }
        lock.unlock();
        if (decided)
          for (int p : peers) sends.push_back(t.async_send(p, tag, std::span<const std::byte>(&mine, 1)));
      }
      if (pending.empty()) break;
      const deadline slice = decided || woken ? until : std::min(until, time.deadline_after(poll));
      std::optional<std::size_t> got;
      try {
        got = t.wait_any(std::span<typename Tr::request* const>(pending), slice);
      } catch (const error& e) {
        if (e.kind() != errc::timeout) throw;
        if (time.now() >= until) throw error(errc::timeout, timed_out(me, peers.size() - pending.size(), decided));
      }
      if (!got) continue;
      t.wait(*pending[*got], until);
      const std::byte word = said[pending_at[*got]];
      if (word != std::byte{0} && word != std::byte{1})
        throw error(errc::protocol, "close_watch: rank " + std::to_string(me) + " got " +
                                        std::to_string(std::to_integer<int>(word)) + " from rank " +
                                        std::to_string(peers[pending_at[*got]]) + ", neither in (1) nor out (0)");
      if (word == std::byte{1}) ++counted;
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(*got));
      pending_at.erase(pending_at.begin() + static_cast<std::ptrdiff_t>(*got));
    }
    if (woken) {  // the sends' waits below end only when they do
      time.waits_end_on_signal(false);
      guard.on = false;
    }
    for (auto& s : sends) t.wait(s, until);

    step_set set;
    set.self_in = mine == std::byte{1};
    for (std::size_t i = 0; i < peers.size(); ++i)
      if (said[i] == std::byte{1}) set.in.push_back(peers[i]);
    if (set.self_in) set.in.insert(std::upper_bound(set.in.begin(), set.in.end(), me), me);
    return set;
  }

 private:
  enum class state { open, ready, in, late };

  std::string timed_out(int me, std::size_t heard, bool decided) const {
    return "close_watch: rank " + std::to_string(me) + " heard " + std::to_string(heard) + " of " +
           std::to_string(size_ - 1) + " peers within the step timeout" +
           (decided ? "" : ", and its own first bucket was not ready") + " (K of N: the step closes when " +
           std::to_string(need_) + " of " + std::to_string(size_) + " ranks ready)";
  }

  int size_, need_;
  std::mutex mutex_;
  support::rank_condition ready_;
  state state_ = state::open;
  std::uint64_t current_ = 0;  // the step of the round open or last run
  bool opened_ = false;        // whether any round has opened
  std::optional<std::uint64_t> marked_;  // a step the caller marked ready before its round opened
};

}  // namespace gradwire::aggregation::detail
