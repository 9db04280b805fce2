// Test support: a one-shot event that one thread raises and another awaits, within a limit.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>

namespace gradwire::testing {

// Orders two threads without a sleep: await() returns once raise() has run, or throws
// after `patience`, so that a broken test fails instead of hanging.
class event {
 public:
  explicit event(std::chrono::milliseconds patience = std::chrono::seconds(5)) : patience_(patience) {}

  void raise() {
    {
      std::lock_guard lock(mutex_);
      raised_ = true;
    }
    cv_.notify_all();
  }

  void await(const std::string& what) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, patience_, [&] { return raised_; }))
      throw std::runtime_error("timed out waiting for " + what);
  }

 private:
  std::chrono::milliseconds patience_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool raised_ = false;
};

}  // namespace gradwire::testing
