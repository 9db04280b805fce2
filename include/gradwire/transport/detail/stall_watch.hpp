// When a rank that waits for a peer speaks up, the same for every transport: it tells its peers what it waits for,
// warns once, and with a stall timeout gives up.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "../../clock.hpp"

namespace gradwire::transport::detail {

// One wait's stall timing (GRADWIRE_STALL_WARN, GRADWIRE_STALL_TIMEOUT). A transport calls
// begin() when a wait goes to sleep (or when it began) and check(now) while it sleeps; tell
// and warn are answered once per wait, give_up at every check from its time on. A rank tells its peers what it waits for a little before the
// first word it may say (the warning or the timeout), so that when it speaks, every rank of
// the chain of waits has had its say too.
class stall_watch {
 public:
  stall_watch(std::chrono::milliseconds warn, std::chrono::milliseconds give_up) : warn_(warn), give_up_(give_up) {}

  struct due {
    bool tell = false;     // tell the peers what this rank waits for
    bool warn = false;     // log the stall warning
    bool give_up = false;  // fail with timeout (stall timeout)
  };

  void begin(clock::time_point now) noexcept {
    began_ = now;
    told_ = warned_ = false;
  }
  bool told() const noexcept { return told_; }

  std::chrono::milliseconds waited(clock::time_point now) const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - began_);
  }

  due check(clock::time_point now) noexcept {
    const auto w = waited(now);
    const bool gives_up = give_up_.count() > 0;
    const auto first_word = gives_up ? std::min(warn_, give_up_) : warn_;
    due d;
    if (!told_ && w >= first_word * 3 / 4) d.tell = told_ = true;
    if (!warned_ && w >= warn_ && (!gives_up || w < give_up_)) d.warn = warned_ = true;
    d.give_up = gives_up && w >= give_up_;
    return d;
  }

  // "(gave up after GRADWIRE_STALL_TIMEOUT=0.3 s)"
  std::string gave_up_text() const {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", static_cast<double>(give_up_.count()) / 1000);
    return std::string("(gave up after GRADWIRE_STALL_TIMEOUT=") + limit + " s)";
  }

 private:
  std::chrono::milliseconds warn_, give_up_;
  clock::time_point began_{};
  bool told_ = false, warned_ = false;
};

}  // namespace gradwire::transport::detail
