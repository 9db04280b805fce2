// What a rank knows of one peer, the same on every network transport (tcp's link, ucx's peer): live, finished,
// suspected for a grace, lost.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "../../clock.hpp"

namespace gradwire::transport::detail {

// A peer is live until it says goodbye (finished: what it sent has arrived or is arriving,
// nothing more will) or is lost (lost_reason says why). A peer whose connection breaks
// without a word is first suspected for a grace: its goodbye, or the abort with the reason
// it failed, may still be on the way on another lane, and the rank should report that, not
// the echo. If the grace ends with no word, the peer is lost: a tolerated peer
// (tolerate_loss) fails only its own operations; otherwise the rank fails with it
// (failure.hpp says how, and what the others are told). So does an operation with it
// withdrawn mid-message (its bytes half through, e.g. after a timeout): the connection is
// out of step, and a tolerated peer is cut off (lost) where another fails the rank.
struct peer_state {
  bool tolerated = false;
  bool finished = false;
  std::string lost_reason;  // empty while not lost
  // The grace of a suspected peer (suspect()): until when, why it broke as its loss is
  // relayed (abort_notice::reason), and as this rank reports it.
  std::optional<deadline> suspected_until;
  std::string suspected_reason;
  std::string suspected_message;

  bool lost() const noexcept { return !lost_reason.empty(); }
  bool suspected() const noexcept { return suspected_until.has_value(); }
  // Neither finished nor lost: what control messages and new operations may still reach.
  bool live() const noexcept { return !finished && !lost(); }

  void say_goodbye() noexcept {
    finished = true;
    suspected_until.reset();
  }
  void suspect(deadline until, std::string reason, std::string message) {
    suspected_until = until;
    suspected_reason = std::move(reason);
    suspected_message = std::move(message);
  }
  void lose(std::string why) {
    lost_reason = std::move(why);
    suspected_until.reset();
  }
};

}  // namespace gradwire::transport::detail
