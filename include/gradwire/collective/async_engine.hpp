// The async engine: one background thread per communicator that runs queued collectives in order; handles to wait on.
//
// The collectives stay blocking code; an async_engine runs them in order on one thread of
// its own, so the caller's thread computes meanwhile (e.g. applies the optimizer to one
// bucket while the next is being reduced). Rules that keep memory safe:
//  - While anything is queued, only the engine's thread uses the communicator: do not
//    call collectives on it directly until every handle has been waited for.
//  - A buffer passed to an async operation must stay alive and untouched until its
//    handle's wait() returns. A handle that is destroyed first waits for its operation
//    (as std::future from std::async does), and the engine's destructor runs everything
//    queued before it stops, so no operation ever outlives the span it was given.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../clock.hpp"
#include "../error.hpp"
#include "../timeouts.hpp"
#include "../observe/timeline.hpp"

namespace gradwire::collective {

template <class Transport>
class communicator;

namespace detail {

// One queued operation. Slots are recycled, so starting an operation allocates nothing
// once as many have been in flight at once as ever will be.
struct async_slot {
  enum class status : std::uint8_t { free, queued, running, done };
  static constexpr std::size_t capacity = 64;  // bytes of the stored callable

  status state = status::free;  // guarded by async_core::mutex
  std::exception_ptr failure;
  void (*run)(void* comm, async_slot&) = nullptr;
  async_slot* next = nullptr;  // in the queue or in the free list
  time_source time;  // the submitter's (communicator::time())
  deadline done_at{};  // run inline (a simulated rank's): when, on `time`, it finished
  alignas(std::max_align_t) std::byte work[capacity];
};

// What the engine's thread and the handles share; handles keep it alive, so a handle
// that outlives its engine still reports its (finished) operation.
struct async_core {
  std::mutex mutex;
  std::condition_variable work_ready;  // the engine's thread sleeps on it
  std::condition_variable finished;    // waiters sleep on it
  std::vector<std::unique_ptr<async_slot>> slots;
  async_slot* free_list = nullptr;
  async_slot *head = nullptr, *tail = nullptr;  // FIFO of queued operations
  bool stopping = false;
  std::exception_ptr broken;  // the first failure: later operations are not run

  async_slot* acquire() {  // mutex held
    if (!free_list) {
      slots.push_back(std::make_unique<async_slot>());
      return slots.back().get();
    }
    async_slot* s = std::exchange(free_list, free_list->next);
    s->next = nullptr;
    return s;
  }
  void release(async_slot* s) noexcept {  // mutex held
    s->state = async_slot::status::free;
    s->failure = nullptr;
    s->time = {};
    s->done_at = {};
    s->next = std::exchange(free_list, s);
  }
};

}  // namespace detail

// The pending result of an async operation. wait(deadline) returns when it has finished
// and rethrows its error; afterwards the handle is empty. Move-only; destroying a handle
// whose operation has not finished waits for it (its steps have deadlines of their own).
class async_handle {
 public:
  async_handle() = default;
  async_handle(async_handle&& other) noexcept
      : core_(std::move(other.core_)), slot_(std::exchange(other.slot_, nullptr)) {}
  async_handle& operator=(async_handle&& other) noexcept {
    if (this != &other) {
      finish();
      core_ = std::move(other.core_);
      slot_ = std::exchange(other.slot_, nullptr);
    }
    return *this;
  }
  ~async_handle() { finish(); }

  // True while the handle refers to an operation not yet waited for.
  bool valid() const noexcept { return slot_ != nullptr; }

  // True when the operation has finished (or the handle is empty): wait() will not block.
  bool ready() const {
    if (!slot_) return true;
    std::lock_guard lock(core_->mutex);
    return slot_->state == detail::async_slot::status::done;
  }

  // Blocks until the operation has finished, then rethrows its error if it failed. If
  // `until` passes first, throws errc::timeout and the operation goes on: wait again.
  void wait(deadline until) {
    if (!slot_) throw error(errc::invalid_argument, "async_handle::wait: empty handle (already waited for?)");
    std::unique_lock lock(core_->mutex);
    if (!core_->finished.wait_until(lock, until, [&] { return slot_->state == detail::async_slot::status::done; }))
      throw error(errc::timeout,
                  "async collective did not finish before the deadline; it is still queued or running (wait again, "
                  "or raise the deadline)");
    std::exception_ptr failure = std::move(slot_->failure);
    const time_source time = slot_->time;
    const deadline done_at = slot_->done_at;
    core_->release(std::exchange(slot_, nullptr));
    lock.unlock();
    core_.reset();
    time.advance_to(done_at);
    if (failure) std::rethrow_exception(failure);
  }

 private:
  template <class>
  friend class async_engine;
  async_handle(std::shared_ptr<detail::async_core> core, detail::async_slot* slot)
      : core_(std::move(core)), slot_(slot) {}

  void finish() noexcept {
    if (!slot_) return;
    std::unique_lock lock(core_->mutex);
    core_->finished.wait(lock, [&] { return slot_->state == detail::async_slot::status::done; });
    const time_source time = slot_->time;
    const deadline done_at = slot_->done_at;
    core_->release(std::exchange(slot_, nullptr));
    lock.unlock();
    core_.reset();
    time.advance_to(done_at);  // a simulated rank's clock moves to when it finished
  }

  std::shared_ptr<detail::async_core> core_;
  detail::async_slot* slot_ = nullptr;
};

// Runs collectives on `comm` in the order they were started, on one thread of its own.
// Transport: concepts::transport (see communicator). Not movable: the thread refers to it.
// Once an operation fails, later ones fail without running (with the same errc and the
// first failure's message): the ranks' sequences no longer line up after a failure.
template <class Transport>
class async_engine {
 public:
  using transport_type = Transport;

  explicit async_engine(communicator<Transport>& comm)
      : comm_(comm), core_(std::make_shared<detail::async_core>()), thread_([this] { serve(); }) {}
  async_engine(const async_engine&) = delete;
  async_engine& operator=(const async_engine&) = delete;

  // Runs everything queued (handles still report each outcome), then stops the thread.
  ~async_engine() {
    {
      std::lock_guard lock(core_->mutex);
      core_->stopping = true;
    }
    core_->work_ready.notify_one();
    thread_.join();
  }

  communicator<Transport>& comm() noexcept { return comm_; }

  // Queues fn(comm) behind everything queued before; never blocks. F is a small
  // trivially copyable callable (a lambda capturing spans and values), stored inline.
  template <class F>
  async_handle submit(F fn) {
    static_assert(std::is_trivially_copyable_v<F> && sizeof(F) <= detail::async_slot::capacity &&
                      alignof(F) <= alignof(std::max_align_t),
                  "async_engine::submit: the callable must be trivially copyable and at most 64 bytes (capture "
                  "spans and values, not containers)");
    static_assert(std::is_invocable_v<F&, communicator<Transport>&>,
                  "async_engine::submit: the callable must take communicator<Transport>&");
    const time_source time = comm_.time();
    const bool inline_run = time.runs_background_inline();
    detail::async_slot* s;
    std::exception_ptr broken;  // for a simulated rank's inline run
    {
      std::lock_guard lock(core_->mutex);
      if (core_->stopping) throw error(errc::invalid_argument, "async_engine: submit during destruction");
      s = core_->acquire();
      ::new (static_cast<void*>(s->work)) F(fn);
      s->run = [](void* comm, detail::async_slot& slot) {
        (*std::launder(reinterpret_cast<F*>(slot.work)))(*static_cast<communicator<Transport>*>(comm));
      };
      s->time = time;
      if (inline_run) {
        s->state = detail::async_slot::status::running;
        broken = core_->broken;
      } else {
        s->state = detail::async_slot::status::queued;
        (core_->tail ? core_->tail->next : core_->head) = s;
        core_->tail = s;
      }
    }
    if (inline_run)
      run_in_virtual_background(time, *s, broken);
    else
      core_->work_ready.notify_one();
    return async_handle(core_, s);
  }

 private:
  void serve() {
    observe::detail::this_thread_track() = 1;  // its collectives get their own timeline track
    auto& core = *core_;
    std::unique_lock lock(core.mutex);
    for (;;) {
      core.work_ready.wait(lock, [&] { return core.head != nullptr || core.stopping; });
      if (!core.head) return;  // stopping, and nothing left to run
      detail::async_slot* s = core.head;
      core.head = s->next;
      if (!core.head) core.tail = nullptr;
      s->next = nullptr;
      s->state = detail::async_slot::status::running;
      const std::exception_ptr broken = core.broken;
      lock.unlock();
      std::exception_ptr failure = run_slot(*s, broken);
      lock.lock();
      finish_slot(*s, std::move(failure));
      core.finished.notify_all();
    }
  }

  // Runs a slot's operation, or fails it unstarted after an earlier failure (`broken`);
  // returns how it failed (null: it did not).
  std::exception_ptr run_slot(detail::async_slot& s, const std::exception_ptr& broken) noexcept {
    try {
      if (broken) not_started(broken);
      s.run(&comm_, s);
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  // Records a slot's outcome; the first failure breaks the engine (core_->mutex held).
  void finish_slot(detail::async_slot& s, std::exception_ptr failure) noexcept {
    if (failure && !core_->broken) core_->broken = failure;
    s.failure = std::move(failure);
    s.state = detail::async_slot::status::done;
  }

  // A simulated rank has no second thread to give (its ranks run one at a time, in virtual
  // time): the operation runs now, inline, on the rank's background clock, so it overlaps
  // the caller's later compute in virtual time as it would on the engine's thread.
  void run_in_virtual_background(time_source time, detail::async_slot& s, const std::exception_ptr& broken) {
    struct context {
      async_engine* engine;
      detail::async_slot* slot;
      const std::exception_ptr* broken;
      std::exception_ptr failure;
    } c{this, &s, &broken, nullptr};
    const deadline done = time.run_in_background(
        [](void* p) {
          auto& c = *static_cast<context*>(p);
          int& track = observe::detail::this_thread_track();  // the engine's track, as on its thread
          const int caller_track = std::exchange(track, 1);
          c.failure = c.engine->run_slot(*c.slot, *c.broken);
          track = caller_track;
        },
        &c);
    std::lock_guard lock(core_->mutex);
    finish_slot(s, std::move(c.failure));
    s.done_at = done;
  }

  [[noreturn]] static void not_started(const std::exception_ptr& broken) {
    errc kind = errc::peer_lost;
    std::string what;
    try {
      std::rethrow_exception(broken);
    } catch (const error& e) {
      kind = e.kind();
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown exception";
    }
    throw error(kind, "async collective not started: an earlier one on this communicator failed: " + what);
  }

  communicator<Transport>& comm_;
  std::shared_ptr<detail::async_core> core_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace gradwire::collective
