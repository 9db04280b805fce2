// GRADWIRE_TIMELINE=path.json: Chrome trace events of every step, collective, bucket, push,
// pull and optimizer step (with bytes and duration), one track per rank, for Perfetto
// (ui.perfetto.dev) or chrome://tracing.
//
// Events are kept in memory (no I/O on the hot path) and written when the process exits
// or write_timeline() is called. The ranks of a multi-process job all write to the same
// file: each process merges its events in under an exclusive lock (flock), and the file
// is a complete JSON document after every merge. The process holding rank 0 empties the
// file when that rank joins (before any rank can have finished), so a rerun replaces the
// previous run's trace instead of adding to it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../clock.hpp"
#include "activity.hpp"
#include "log.hpp"

#if __has_include(<sys/file.h>) && __has_include(<unistd.h>)
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define GRADWIRE_TIMELINE_POSIX 1
#endif

namespace gradwire::observe {

// One argument of an event: a number, or a string with static storage duration.
struct trace_arg {
  const char* key = nullptr;  // nullptr: unused
  const char* text = nullptr;
  std::int64_t number = 0;
};

// A complete event ("ph":"X"). Names, categories and texts must have static storage
// duration (string literals): recording copies no strings.
struct trace_event {
  const char* name = "";
  const char* category = "";
  int rank = 0, size = 1;  // of the communicator it ran on
  int track = 0;  // the rank's thread: 0 the caller's, 1 the background collectives
  std::int64_t begin_ns = 0;     // Unix time
  std::int64_t duration_ns = 0;
  std::uint64_t bytes = 0;
  trace_arg args[2];
};

// The process's recorder (one per process: ranks that are threads share it).
class timeline {
 public:
  // The trace's process id ("pid", one track per rank) of rank `rank` of a job of `size`:
  // the rank itself, except that a one-rank job (one_device, or a reference run beside the
  // real job in the same process) gets a pid of its own instead of colliding with rank 0.
  static constexpr int one_rank_pid = 100000;
  static constexpr int pid_of(int rank, int size) noexcept { return size == 1 ? one_rank_pid : rank; }

  // At most this many events are kept between writes; later ones are counted and dropped.
  static constexpr std::size_t max_events = std::size_t{1} << 21;

  static timeline& global() {
    static timeline instance(std::getenv("GRADWIRE_TIMELINE"));
    return instance;
  }

  timeline(const timeline&) = delete;
  timeline& operator=(const timeline&) = delete;
  ~timeline() {
    try {
      write();
    } catch (...) {  // exiting: nothing better to do than lose the trace
    }
  }

  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // Starts recording into `path` (what GRADWIRE_TIMELINE does at start-up). A file that
  // cannot be opened is reported on stderr, and nothing is recorded.
  void start(const std::filesystem::path& path) {
    std::lock_guard lock(mutex_);
    start_locked(path);
  }
  // Stops recording; what was recorded is still written.
  void stop() noexcept { enabled_.store(false, std::memory_order_relaxed); }

  // A rank joined (its communicator was made): names its track. The first time rank 0
  // joins in this process, and before anything was written, the file is emptied.
  void add_rank(int rank, int size) {
    if (!enabled()) return;
    std::lock_guard lock(mutex_);
    if (std::find(ranks_.begin(), ranks_.end(), std::pair{rank, size}) == ranks_.end())
      ranks_.emplace_back(rank, size);
    if (rank == 0 && !touched_file_) {
      touched_file_ = true;
      with_locked_file([](int fd) { return ::ftruncate(fd, 0) == 0; });
    }
  }

  void record(const trace_event& e) {
    std::lock_guard lock(mutex_);
    if (events_.size() >= max_events) {
      ++dropped_;
      return;
    }
    events_.push_back(e);
  }

  // The events recorded and not yet written (for tests and tools).
  std::vector<trace_event> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }

  // Merges what was recorded into the file and forgets it. Returns false (and says why
  // on stderr) when the file cannot be written.
  GRADWIRE_DECL bool write();

  // Now on `time`, in the timeline's clock: Unix time, advanced by the steady clock (so
  // durations never go backwards; processes of one machine share the Unix epoch). On a
  // simulated rank's virtual time, that time from the simulation's start, so a simulated
  // trace reads as a real one that began at the epoch.
  std::int64_t now_ns(time_source time = {}) const noexcept {
    if (virtual_time* v = time.virtual_clock()) return v->now_ns();
    return unix_at_start_ns_ + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - steady_at_start_)
                                   .count();
  }

 private:
  static constexpr std::string_view head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  static constexpr std::string_view tail = "\n]}\n";

  explicit timeline(const char* env)
      : unix_at_start_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count()),
        steady_at_start_(std::chrono::steady_clock::now()) {
    if (env && *env) start_locked(env);
  }

  void start_locked(const std::filesystem::path& path) {
    enabled_.store(false, std::memory_order_relaxed);
#ifdef GRADWIRE_TIMELINE_POSIX
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "gradwire: GRADWIRE_TIMELINE=%s: cannot open it for writing (%s); no timeline is recorded\n",
                   path.c_str(), std::strerror(errno));
      return;
    }
    ::close(fd);
    path_ = path;
    events_.reserve(std::size_t{1} << 14);
    enabled_.store(true, std::memory_order_relaxed);
#else
    std::fprintf(stderr, "gradwire: GRADWIRE_TIMELINE=%s: timelines need a POSIX system; none is recorded\n",
                 path.string().c_str());
#endif
  }

  // Runs fn(fd) on the file, opened and locked exclusively against the job's other processes.
  template <class F>
  bool with_locked_file(F&& fn) {
#ifdef GRADWIRE_TIMELINE_POSIX
    if (path_.empty()) return false;
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
      std::fprintf(stderr, "gradwire: timeline %s: cannot open and lock it (%s)\n", path_.c_str(),
                   std::strerror(errno));
      if (fd >= 0) ::close(fd);
      return false;
    }
    const bool ok = fn(fd);
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return ok;
#else
    (void)fn;
    return false;
#endif
  }

#ifdef GRADWIRE_TIMELINE_POSIX
  // Appends `body` (events separated by ",\n") inside the file's event list.
  bool merge(int fd, const std::string& body) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return false;
    const auto size = static_cast<std::size_t>(st.st_size);
    std::string out;
    bool append = false;
    if (size >= head.size() + tail.size()) {
      std::string end(tail.size(), '\0');
      append = ::pread(fd, end.data(), end.size(), static_cast<off_t>(size - tail.size())) ==
                   static_cast<ssize_t>(end.size()) &&
               end == tail;
    }
    if (append) {
      out.append(",\n").append(body).append(tail);
      if (::ftruncate(fd, static_cast<off_t>(size - tail.size())) != 0) return false;
    } else {
      if (size > 0)
        std::fprintf(stderr, "gradwire: timeline %s held something other than a gradwire trace; replaced it\n",
                     path_.c_str());
      out.append(head).append(body).append(tail);
      if (::ftruncate(fd, 0) != 0) return false;
    }
    const off_t at = ::lseek(fd, 0, SEEK_END);
    if (at < 0 || ::pwrite(fd, out.data(), out.size(), at) != static_cast<ssize_t>(out.size())) {
      std::fprintf(stderr, "gradwire: timeline %s: write failed (%s)\n", path_.c_str(), std::strerror(errno));
      return false;
    }
    return true;
  }
#endif

  static void json_string(std::string& out, const char* s) {
    out += '"';
    for (; *s; ++s) {
      const char c = *s;
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
        out += escaped;
      } else {
        out += c;
      }
    }
    out += '"';
  }

  // Events in the Trace Event Format: ts and dur in microseconds; pid = pid_of(rank, size), tid = track.
  GRADWIRE_DECL std::string render() const;

  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  std::filesystem::path path_;
  std::vector<trace_event> events_;
  std::vector<std::pair<int, int>> ranks_;  // (rank, size) joined since the last write
  std::uint64_t dropped_ = 0;
  bool touched_file_ = false;  // emptied it, or merged into it: never empty it (again)
  std::int64_t unix_at_start_ns_;
  std::chrono::steady_clock::time_point steady_at_start_;
};

// Writes what this process recorded now (it is also written at exit).
inline bool write_timeline() { return timeline::global().write(); }

namespace detail {
// The timeline track of this thread: 0 for the caller's thread, 1 for a communicator's
// background collectives (collective::async_engine sets it).
inline int& this_thread_track() noexcept {
  thread_local int track = 0;
  return track;
}
}  // namespace detail

// Times a region of one rank's work: records a timeline event when GRADWIRE_TIMELINE is
// on, and logs a line at GRADWIRE_LOG=debug; costs one branch when both are off. It also
// names this thread's current activity for stall reports (observe/activity.hpp).
class trace_scope {
 public:
  // `time`: the rank's (communicator::time()), so a simulated rank's events are in virtual time.
  trace_scope(time_source time, int rank, int size, const char* name, const char* category,
              std::uint64_t bytes = 0) noexcept
      : outer_name_(std::exchange(current_activity().name, name)), time_(time) {
    // Off: two relaxed loads and nothing else inline; the rest is out of line and cold,
    // so that an instrumented collective compiles to nearly what it was without it.
    if (timeline::global().enabled() || log_enabled(log_level::debug)) [[unlikely]]
      begin(rank, size, name, category, bytes);
  }
  // Movable (a helper may return one); the moved-from scope records nothing.
  trace_scope(trace_scope&& other) noexcept
      : traced_(std::exchange(other.traced_, false)),
        logged_(std::exchange(other.logged_, false)),
        restores_(std::exchange(other.restores_, false)),
        outer_name_(other.outer_name_),
        time_(other.time_),
        event_(other.event_) {}
  trace_scope& operator=(trace_scope&&) = delete;

  ~trace_scope() {
    if (restores_) current_activity().name = outer_name_;
    if (traced_ || logged_) [[unlikely]]
      end();
  }

  // Up to two arguments besides bytes (a third replaces the second).
  trace_scope& arg(const char* key, std::int64_t number) noexcept { return add({key, nullptr, number}); }
  trace_scope& arg(const char* key, const char* text) noexcept { return add({key, text, 0}); }
  trace_scope& bytes(std::uint64_t n) noexcept {
    event_.bytes = n;
    return *this;
  }

 private:
  [[gnu::noinline, gnu::cold]] void begin(int rank, int size, const char* name, const char* category,
                                          std::uint64_t bytes) noexcept {
    traced_ = timeline::global().enabled();
    logged_ = log_enabled(log_level::debug);
    event_.name = name;
    event_.category = category;
    event_.rank = rank;
    event_.size = size;
    event_.track = detail::this_thread_track();
    event_.bytes = bytes;
    event_.begin_ns = timeline::global().now_ns(time_);
  }
  [[gnu::noinline, gnu::cold]] void end() noexcept {
    event_.duration_ns = timeline::global().now_ns(time_) - event_.begin_ns;
    try {
      if (traced_) timeline::global().record(event_);
      if (logged_) log_line();
    } catch (...) {  // observing must never turn into a failure of what is observed
    }
  }
  trace_scope& add(trace_arg a) noexcept {
    event_.args[event_.args[0].key ? 1 : 0] = a;
    return *this;
  }
  GRADWIRE_DECL void log_line() const;

  bool traced_ = false, logged_ = false;
  bool restores_ = true;    // gives the activity back to the enclosing scope (not when moved from)
  const char* outer_name_;  // the enclosing scope's activity name
  time_source time_;
  trace_event event_;
};

}  // namespace gradwire::observe

#if GRADWIRE_HEADER_ONLY  // else compiled once, in src/core.cpp (config.hpp)
#include "timeline.ipp"
#endif
