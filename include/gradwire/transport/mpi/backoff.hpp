// How mpi's waits pass the time between polls: polling hot or yielding first, then sleeps that double up to max_sleep.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "../../clock.hpp"
#include "../../support/waiting.hpp"
#include "options.hpp"

namespace gradwire::transport::detail {

// Polls, then sleeps between polls (transport/mpi.hpp's top says why). The poll window is
// hot while `gate` (nullptr: not every rank here has a CPU) says it pays, else it yields.
class mpi_backoff {
 public:
  mpi_backoff(const mpi_options& o, support::spin_gate* gate)
      : options_(o), gate_(gate), hot_(gate && gate->open()), hot_until_(clock::now() + o.poll_before_sleep) {}
  mpi_backoff(const mpi_backoff&) = delete;
  mpi_backoff& operator=(const mpi_backoff&) = delete;
  ~mpi_backoff() {
    if (hot_) gate_->spun(sleep_.count() == 0 && clock::now() < hot_until_);
  }
  void pause() {
    if (sleep_.count() == 0) {
      if (clock::now() < hot_until_) {
        hot_ ? support::cpu_relax() : std::this_thread::yield();
        return;
      }
      sleep_ = std::chrono::microseconds(10);
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::max(options_.max_sleep, std::chrono::microseconds(10)));
  }
  bool sleeping() const noexcept { return sleep_.count() != 0; }

 private:
  const mpi_options& options_;
  support::spin_gate* gate_;
  bool hot_;
  deadline hot_until_;
  std::chrono::microseconds sleep_{0};
};

}  // namespace gradwire::transport::detail
