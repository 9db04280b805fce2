// A condition variable between a rank's threads that also works between a simulated rank's virtual threads.
//
// K of N's caller and communicator thread share state under a mutex and wake each other
// (aggregation/detail/k_of_n.hpp, close_watch.hpp). On a simulated rank both are virtual
// threads that take turns with every other rank's (transport/simulated/scheduler.hpp): a
// thread that slept on an OS condition variable would stop the virtual clock with it, and
// one that read the shared state without first letting the threads behind it in virtual
// time run would see it as it was in the past. So on a virtual clock:
//  - lock() first lets every thread behind the caller run (virtual_time::yield); a thread
//    never yields its turn while holding the mutex, so the mutex is never contended;
//  - wait_until() releases the mutex and waits in virtual time for a signal or the deadline;
//  - notify_all() wakes the rank's other threads at the notifier's time.
// On the steady clock it is a std::condition_variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>

#include "../clock.hpp"

namespace gradwire::support {

class rank_condition {
 public:
  rank_condition() = default;
  explicit rank_condition(time_source time) noexcept : virtual_(time.virtual_clock()) {}

  std::unique_lock<std::mutex> lock(std::mutex& m) const {
    if (virtual_) virtual_->yield();
    return std::unique_lock<std::mutex>(m);
  }

  // Waits until ready() (checked with the lock held) or `until`; returns ready().
  template <class Ready>
  bool wait_until(std::unique_lock<std::mutex>& lock, deadline until, Ready ready) {
    if (!virtual_) return changed_.wait_until(lock, until, ready);
    const std::int64_t limit =
        until == deadline::max()
            ? std::numeric_limits<std::int64_t>::max()
            : std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count();
    while (!ready()) {
      lock.unlock();
      const bool signalled = virtual_->wait_signal(limit);
      lock.lock();
      if (!signalled) return ready();
    }
    return true;
  }

  void notify_all() {
    if (virtual_) virtual_->signal();
    else changed_.notify_all();
  }

 private:
  virtual_time* virtual_ = nullptr;
  std::condition_variable changed_;
};

}  // namespace gradwire::support
