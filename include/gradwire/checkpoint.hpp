// Checkpoints: save a strategy's parameters, optimizer state and training step to one file; load them back.
//
//   if (strategy.rank() == 0) gradwire::save_checkpoint("run/model.ckpt", strategy, step);
//   ...
//   step = gradwire::load_checkpoint("run/model.ckpt", strategy);   // on every rank
//
// Saving is atomic: the bytes go to `path.tmp.<pid>`, which is fsync'd, renamed over
// `path`, and then the directory is fsync'd; a crash or an error while saving leaves the
// previous checkpoint as it was (and at worst a stale .tmp file, which load ignores).
// Loading checks the whole file (sizes against the file's size, then a CRC-32C of every
// byte, then that dtype, optimizer and tensor sizes match the strategy) before it writes
// a single byte into the strategy, and refuses with errc::config naming the file.
//
// Several ranks. Replicas of mirrored, multi_worker_mirrored and central_storage are
// identical after every step, so the chief (rank 0) alone saves. To resume, construct
// the strategy on every rank as usual and then call load_checkpoint on EVERY rank with
// the same file (a shared filesystem, or a copy per machine): the optimizer state is not
// part of the strategy's setup broadcast, so loading on rank 0 alone would restore its
// parameters (broadcast only at construction) but leave the other ranks' optimizer state
// fresh, and central_storage's owner needs its state too. load_checkpoint is local (no
// communication), so all ranks must load the same file to stay identical.
// local_sgd replicas differ between averaging points and keep their optimizer state per
// replica: save at an averaging point (step % H == 0), and save one file per rank if each
// replica's Adam/momentum state must come back exactly.
// sharded (ZeRO-1) replicas hold different shards of the optimizer state: every rank saves
// its own file and loads its own file back; a file from a job of another size is refused.
// DiLoCo (averaging with an outer optimizer) keeps state of its own, which its checkpoints
// carry too (concepts::checkpointing_agent): the anchor, the outer optimizer's state, the
// local step count and, streamed, the fragments whose update is pending (with a delay their
// all-reduces are waited for first). Its replicas differ between synchronisations, so every
// rank saves and loads its own file, at any step; training restored into strategies built
// with the same settings goes on bit for bit.
//
// What is saved: the values, not the hyperparameters (lr, betas, ...): those come from
// the code that builds the optimizer, so a schedule may change them across a restart.
//
// Format version 1, little-endian:
//    0 magic u32 ("GWCK")   4 version u16   6 dtype u8   7 name_length u8
//    8 step u64            16 tensors u64  24 buffers u32 (optimizer buffers per tensor)
//   28 counters u32 (optimizer step counters per tensor)
//   32 optimizer name (name_length bytes)
//      per tensor: element count u64, then each optimizer buffer's length u64
//      data, per tensor: parameters, each optimizer buffer, each counter (i64)
//      CRC-32C u32 of every byte before it
// Version 2, written only where the aggregation keeps state of its own (a strategy without
// it writes version 1, byte for byte as before): version 1 with, after the tensors' lengths,
//      kind_length u32, kind (the aggregation and its settings), agent buffers u64,
//      agent counters u64, each agent buffer's length u64
// and, after the tensors' data, each agent buffer (dtype's elements), each agent counter
// (u64), then the CRC-32C.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "concepts.hpp"
#include "error.hpp"
#include "tensor/dtype.hpp"
#include "support/crc32c.hpp"

namespace gradwire {

inline constexpr std::uint32_t checkpoint_magic = 0x4b435747;  // "GWCK" in memory order
inline constexpr std::uint16_t checkpoint_format_version = 1;
// The format of a strategy whose aggregation keeps state of its own (DiLoCo): version 1
// plus that state (see the top of this file).
inline constexpr std::uint16_t checkpoint_aggregation_format_version = 2;

namespace detail::checkpoint {

inline constexpr std::size_t fixed_header = 32;
inline constexpr std::size_t chunk = std::size_t{1} << 20;
inline constexpr std::uint32_t max_buffers = 64;  // per tensor; far above any optimizer's
inline constexpr std::uint32_t max_kind = 4096;    // bytes of an aggregation's kind; far above any

inline std::string quoted(const std::filesystem::path& p) {
  std::string out = p.string();  // appended, not "'" + ...: GCC 12 warns falsely (-Wrestrict) on that
  out.insert(out.begin(), '\'');
  out += '\'';
  return out;
}

[[noreturn]] inline void fail(const std::filesystem::path& p, const std::string& what) {
  throw error(errc::config, "checkpoint " + quoted(p) + ": " + what);
}

[[noreturn]] inline void fail_errno(const std::filesystem::path& p, const std::string& doing, int err) {
  fail(p, doing + ": " + std::generic_category().message(err));
}

// Owns a file descriptor.
class file {
 public:
  explicit file(int fd) noexcept : fd_(fd) {}
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

inline void write_all(int fd, const std::byte* p, std::size_t n, const std::filesystem::path& path) {
  while (n > 0) {
    const ::ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "cannot write (check free space and permissions)", errno);
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

inline void read_at(int fd, std::byte* p, std::size_t n, std::uint64_t offset, const std::filesystem::path& path) {
  while (n > 0) {
    const ::ssize_t k = ::pread(fd, p, n, static_cast<::off_t>(offset));
    if (k < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "cannot read", errno);
    }
    if (k == 0) fail(path, "it became shorter while being read; is another process writing it?");
    p += k;
    n -= static_cast<std::size_t>(k);
    offset += static_cast<std::uint64_t>(k);
  }
}

// Buffers small writes and checksums everything that passes through.
class sink {
 public:
  sink(int fd, const std::filesystem::path& path) : fd_(fd), path_(path) { buffer_.reserve(chunk); }
  void put(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    crc_ = support::crc32c({p, n}, crc_);
    if (buffer_.size() + n > chunk) flush();
    if (n >= chunk)
      write_all(fd_, p, n, path_);  // large tensors go straight from their memory
    else
      buffer_.insert(buffer_.end(), p, p + n);
  }
  template <class U>
  void put_value(U v) {
    put(&v, sizeof v);
  }
  void flush() {
    write_all(fd_, buffer_.data(), buffer_.size(), path_);
    buffer_.clear();
  }
  std::uint32_t crc() const noexcept { return crc_; }

 private:
  int fd_;
  const std::filesystem::path& path_;
  std::vector<std::byte> buffer_;
  std::uint32_t crc_ = 0;
};

template <class U>
U load_value(const std::byte* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// What a file's (or a strategy's) header says, beyond the fixed fields.
struct layout {
  dtype type{};
  std::string optimizer;
  std::uint32_t buffers = 0, counters = 0;
  std::vector<std::uint64_t> lengths;  // per tensor: element count, then each buffer's length
  std::size_t tensors() const { return lengths.size() / (std::size_t{buffers} + 1); }
};

// The name a checkpoint records: the optimizer type's, or the one chosen at run time.
template <class Model>
std::string optimizer_name(const Model& m) {
  using O = typename Model::optimizer_type;
  if constexpr (concepts::named_by_type<O>)
    return std::string(std::string_view(O::name));
  else
    return std::string(m.optimizer().name());
}

template <class Strategy>
layout layout_of(const Strategy& s) {
  using V = typename Strategy::value_type;
  layout out{dtype_of_v<V>, optimizer_name(s), 0, 0, {}};
  const auto params = s.parameters();
  const auto states = s.optimizer_states();
  for (std::size_t i = 0; i < params.size(); ++i) {
    out.lengths.push_back(params[i].size());
    std::uint32_t buffers = 0, counters = 0;
    states[i].for_each_buffer([&](std::span<const V> b) {
      out.lengths.push_back(b.size());
      ++buffers;
    });
    states[i].for_each_counter([&](const long&) { ++counters; });
    // Counts go into the header once, so every tensor's state must have the same.
    if (i > 0 && (buffers != out.buffers || counters != out.counters))
      throw error(errc::invalid_argument, "checkpoint: optimizer '" + out.optimizer +
                                              "' keeps a different number of buffers or counters per tensor; "
                                              "checkpoints need the same number for every tensor");
    out.buffers = buffers;
    out.counters = counters;
  }
  return out;
}

// What an aggregation keeps beside the parameters (concepts::checkpointing_agent: DiLoCo's
// anchor, outer state and pending fragments), as a version 2 header lists it.
struct agent_layout {
  bool present = false;  // false: a version 1 file, or a strategy whose aggregation keeps nothing
  std::string kind;
  std::vector<std::uint64_t> lengths;  // each buffer's elements
  std::uint64_t counters = 0;
};

template <class Model>
agent_layout agent_layout_of(const Model& m) {
  agent_layout out;
  if constexpr (concepts::checkpoint_model_with_agent_state<Model>) {
    using V = typename Model::value_type;
    const auto& agent = m.aggregation();
    out.present = true;
    out.kind = agent.checkpoint_kind();
    agent.for_each_checkpoint_buffer([&](std::span<const V> b) { out.lengths.push_back(b.size()); });
    agent.for_each_checkpoint_counter([&](const std::uint64_t&) { ++out.counters; });
  } else {
    (void)m;
  }
  return out;
}

inline std::string plural(std::uint64_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// The compile-time conditions of save_checkpoint and load_checkpoint, stated once.
template <class Optimizer, class V>
constexpr void require_checkpointable() {
  static_assert(concepts::checkpointable_optimizer<Optimizer, V>,
                "gradwire checkpoints: the optimizer needs a static `name` (or name() const) and "
                "state<V>::for_each_buffer(f) / "
                "for_each_counter(f) (concepts::checkpointable_optimizer in gradwire/concepts.hpp; "
                "gradwire/optim/adam.hpp has both)");
  static_assert(std::endian::native == std::endian::little,
                "gradwire checkpoints are little-endian; big-endian hosts are not supported yet");
}

}  // namespace detail::checkpoint

namespace detail::checkpoint {

template <class Model>
void save(const std::filesystem::path& path, const Model& strategy, std::uint64_t step) {
  using V = typename Model::value_type;
  using Optimizer = typename Model::optimizer_type;
  detail::checkpoint::require_checkpointable<Optimizer, V>();
  namespace ck = detail::checkpoint;
  const ck::layout layout = ck::layout_of(strategy);
  if (layout.optimizer.size() > 255)
    ck::fail(path, "optimizer name '" + layout.optimizer + "' is longer than 255 bytes; shorten Optimizer::name");
  const ck::agent_layout agent = ck::agent_layout_of(strategy);  // refused here while its state is not final
  if (agent.kind.size() > ck::max_kind)
    ck::fail(path, "the aggregation's kind is longer than " + std::to_string(ck::max_kind) + " bytes");

  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  // O_TRUNC: a stale temporary of an earlier crashed save with our pid is overwritten.
  ck::file f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (f.get() < 0)
    ck::fail_errno(tmp, "cannot create the temporary file (check that the directory exists and is writable)", errno);
  try {
    ck::sink out(f.get(), tmp);
    out.put_value(checkpoint_magic);
    out.put_value(agent.present ? checkpoint_aggregation_format_version : checkpoint_format_version);
    out.put_value(static_cast<std::uint8_t>(layout.type));
    out.put_value(static_cast<std::uint8_t>(layout.optimizer.size()));
    out.put_value(step);
    out.put_value(static_cast<std::uint64_t>(strategy.parameters().size()));
    out.put_value(layout.buffers);
    out.put_value(layout.counters);
    out.put(layout.optimizer.data(), layout.optimizer.size());
    for (std::uint64_t n : layout.lengths) out.put_value(n);
    if (agent.present) {
      out.put_value(static_cast<std::uint32_t>(agent.kind.size()));
      out.put(agent.kind.data(), agent.kind.size());
      out.put_value(static_cast<std::uint64_t>(agent.lengths.size()));
      out.put_value(agent.counters);
      for (std::uint64_t n : agent.lengths) out.put_value(n);
    }
    const auto params = strategy.parameters();
    const auto states = strategy.optimizer_states();
    for (std::size_t i = 0; i < params.size(); ++i) {
      out.put(params[i].data(), params[i].size() * sizeof(V));
      states[i].for_each_buffer([&](std::span<const V> b) { out.put(b.data(), b.size_bytes()); });
      states[i].for_each_counter([&](const long& c) { out.put_value(static_cast<std::int64_t>(c)); });
    }
    if constexpr (concepts::checkpoint_model_with_agent_state<Model>) {
      strategy.aggregation().for_each_checkpoint_buffer([&](std::span<const V> b) { out.put(b.data(), b.size_bytes()); });
      strategy.aggregation().for_each_checkpoint_counter([&](const std::uint64_t& c) { out.put_value(c); });
    }
    const std::uint32_t crc = out.crc();
    out.put_value(crc);
    out.flush();
    if (::fsync(f.get()) != 0) ck::fail_errno(tmp, "fsync failed", errno);
    if (::close(f.release()) != 0) ck::fail_errno(tmp, "close failed", errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      ck::fail_errno(path, "cannot rename " + ck::quoted(tmp) + " over it", errno);
  } catch (...) {
    ::unlink(tmp.c_str());  // the previous checkpoint at `path` is untouched
    throw;
  }
  // The rename is durable only once the directory entry is on disk.
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  ck::file d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() < 0) ck::fail_errno(path, "saved, but cannot open its directory to fsync it", errno);
  if (::fsync(d.get()) != 0 && errno != EINVAL)  // some filesystems cannot sync directories
    ck::fail_errno(path, "saved, but fsync of its directory failed", errno);
}

}  // namespace detail::checkpoint

// Writes `strategy`'s parameters and optimizer state, and `step` (the caller's training
// step, returned by load_checkpoint), to `path` atomically (see the top of this file).
// Not collective: in a job of several ranks call it on rank 0 only (or, where replicas
// differ, on each rank with a file of its own). An aggregation that keeps state of its own
// (DiLoCo) has it saved too; on a const strategy, its background all-reduces must have been
// waited for (aggregation().wait_in_flight(communicator())), else errc::invalid_argument.
template <concepts::checkpoint_model Model>
void save_checkpoint(const std::filesystem::path& path, const Model& strategy, std::uint64_t step = 0) {
  detail::checkpoint::save(path, strategy, step);
}
// ... and on a strategy that may be changed, they are waited for here (each is a collective
// every rank started, so the other ranks need not be saving; their updates still land at
// their steps).
template <concepts::checkpoint_model_with_agent_state Model>
  requires(!std::is_const_v<Model>)
void save_checkpoint(const std::filesystem::path& path, Model& strategy, std::uint64_t step = 0) {
  strategy.aggregation().wait_in_flight(strategy.communicator());
  detail::checkpoint::save(path, strategy, step);
}

// Restores the parameters and optimizer state saved by save_checkpoint into `strategy`
// (built as usual, with the same tensor sizes and optimizer) and returns the saved step.
// Refuses with errc::config, without touching `strategy`, a file that is missing,
// truncated, corrupt, of another format version, or saved for another dtype, optimizer
// or set of tensor sizes. Local, not collective: every rank loads (see the top of this file).
template <concepts::checkpoint_model Model>
std::uint64_t load_checkpoint(const std::filesystem::path& path, Model& strategy) {
  using V = typename Model::value_type;
  using Optimizer = typename Model::optimizer_type;
  detail::checkpoint::require_checkpointable<Optimizer, V>();
  namespace ck = detail::checkpoint;
  using ck::fail;
  using ck::plural;

  ck::file f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) {
    if (errno == ENOENT)
      fail(path, "no such file; check the path (to start training from scratch, do not load a checkpoint)");
    ck::fail_errno(path, "cannot open", errno);
  }
  struct ::stat st {};
  if (::fstat(f.get(), &st) != 0) ck::fail_errno(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::string truncated = " (" + plural(size, "byte") + "): the file is truncated or corrupt";

  // Fixed header: magic and version first, so another format is named as such.
  std::byte fixed[ck::fixed_header];
  if (size < 4) fail(path, "too short to be a checkpoint" + truncated);
  ck::read_at(f.get(), fixed, 4, 0, path);
  if (ck::load_value<std::uint32_t>(fixed) != checkpoint_magic)
    fail(path, "not a gradwire checkpoint (wrong magic number)");
  if (size < ck::fixed_header + 4) fail(path, "too short for a checkpoint header" + truncated);
  ck::read_at(f.get(), fixed, ck::fixed_header, 0, path);
  const auto version = ck::load_value<std::uint16_t>(fixed + 4);
  if (version != checkpoint_format_version && version != checkpoint_aggregation_format_version)
    fail(path, "format version " + std::to_string(version) + ", but this gradwire reads versions " +
                   std::to_string(checkpoint_format_version) + " and " +
                   std::to_string(checkpoint_aggregation_format_version) + "; load it with the gradwire that wrote it");
  const auto type_byte = ck::load_value<std::uint8_t>(fixed + 6);
  const auto name_length = ck::load_value<std::uint8_t>(fixed + 7);
  const auto step = ck::load_value<std::uint64_t>(fixed + 8);
  const auto tensors = ck::load_value<std::uint64_t>(fixed + 16);
  const auto buffers = ck::load_value<std::uint32_t>(fixed + 24);
  const auto counters = ck::load_value<std::uint32_t>(fixed + 28);
  if (type_byte > static_cast<std::uint8_t>(dtype::bf16) || buffers > ck::max_buffers || counters > ck::max_buffers)
    fail(path, "its header is corrupt (unknown dtype or implausible optimizer state); the file is damaged");

  // Variable header, every length checked against the file's size before it is used.
  std::uint64_t header = ck::fixed_header + name_length;
  const std::uint64_t per_tensor = std::uint64_t{buffers} + 1;
  if (tensors > (size - 4) / 8 / per_tensor || header + tensors * per_tensor * 8 > size - 4)
    fail(path, "its header lists " + plural(tensors, "tensor") + ", more than the file can hold" + truncated);
  header += tensors * per_tensor * 8;
  // Version 2: the aggregation's state described after the tensors' (kind length u32, kind,
  // buffers u64, counters u64, each buffer's length u64).
  const std::uint64_t agent_header = header;
  std::uint32_t kind_length = 0;
  std::uint64_t agent_buffers = 0, agent_counters = 0;
  if (version == checkpoint_aggregation_format_version) {
    std::byte word[8];
    if (header + 4 > size - 4) fail(path, "its header ends before the aggregation's state" + truncated);
    ck::read_at(f.get(), word, 4, header, path);
    kind_length = ck::load_value<std::uint32_t>(word);
    if (kind_length > ck::max_kind)
      fail(path, "its header is corrupt (an implausible aggregation kind); the file is damaged");
    if (header + 4 + kind_length + 16 > size - 4) fail(path, "its header ends before the aggregation's state" + truncated);
    ck::read_at(f.get(), word, 8, header + 4 + kind_length, path);
    agent_buffers = ck::load_value<std::uint64_t>(word);
    ck::read_at(f.get(), word, 8, header + 4 + kind_length + 8, path);
    agent_counters = ck::load_value<std::uint64_t>(word);
    header += 4 + kind_length + 16;
    if (agent_buffers > (size - 4) / 8 || header + agent_buffers * 8 > size - 4)
      fail(path, "its header lists " + plural(agent_buffers, "aggregation buffer") + ", more than the file can hold" +
                     truncated);
    header += agent_buffers * 8;
  }
  std::vector<std::byte> header_bytes(static_cast<std::size_t>(header));
  ck::read_at(f.get(), header_bytes.data(), header_bytes.size(), 0, path);
  ck::layout saved{static_cast<dtype>(type_byte),
                   std::string(reinterpret_cast<const char*>(header_bytes.data() + ck::fixed_header), name_length),
                   buffers,
                   counters,
                   std::vector<std::uint64_t>(static_cast<std::size_t>(tensors * per_tensor))};
  const std::size_t element = size_of(saved.type);
  std::uint64_t expected = header + 4;
  for (std::size_t i = 0; i < saved.lengths.size(); ++i) {
    const auto n = ck::load_value<std::uint64_t>(header_bytes.data() + ck::fixed_header + name_length + 8 * i);
    if (n > size / element || expected + n * element > size)
      fail(path, "its header describes more data than the file holds" + truncated);
    saved.lengths[i] = n;
    expected += n * element;
  }
  if (tensors * counters > size / 8 || expected + tensors * counters * 8 > size)
    fail(path, "its header describes more data than the file holds" + truncated);
  expected += tensors * counters * 8;
  ck::agent_layout saved_agent;
  if (version == checkpoint_aggregation_format_version) {
    const std::byte* at = header_bytes.data() + agent_header;
    saved_agent.present = true;
    saved_agent.kind.assign(reinterpret_cast<const char*>(at + 4), kind_length);
    saved_agent.counters = agent_counters;
    for (std::uint64_t i = 0; i < agent_buffers; ++i) {
      const auto n = ck::load_value<std::uint64_t>(at + 4 + kind_length + 16 + 8 * i);
      if (n > size / element || expected + n * element > size)
        fail(path, "its header describes more data than the file holds" + truncated);
      saved_agent.lengths.push_back(n);
      expected += n * element;
    }
    if (agent_counters > size / 8 || expected + agent_counters * 8 > size)
      fail(path, "its header describes more data than the file holds" + truncated);
    expected += agent_counters * 8;
  }
  if (expected != size)
    fail(path, "its header describes " + plural(expected, "byte") + " but the file has " + std::to_string(size) +
                   "; the file is truncated or corrupt");

  // Every byte, before trusting any of them.
  std::uint32_t crc = support::crc32c(header_bytes);
  {
    std::vector<std::byte> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(ck::chunk, size)));
    for (std::uint64_t at = header; at < size - 4;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), size - 4 - at));
      ck::read_at(f.get(), buffer.data(), n, at, path);
      crc = support::crc32c({buffer.data(), n}, crc);
      at += n;
    }
  }
  std::byte trailer[4];
  ck::read_at(f.get(), trailer, 4, size - 4, path);
  if (ck::load_value<std::uint32_t>(trailer) != crc)
    fail(path, "checksum mismatch (CRC-32C): the file is corrupt; load an earlier checkpoint");

  // Intact: now it must fit this strategy. An aggregation's background all-reduces end
  // first (their results are overwritten; until they end its state is not final).
  if constexpr (concepts::checkpoint_model_with_agent_state<Model>)
    strategy.aggregation().wait_in_flight(strategy.communicator());
  const ck::layout model = ck::layout_of(strategy);
  if (saved.type != model.type)
    fail(path, std::string("saved with dtype ") + name_of(saved.type) + ", the model is " + name_of(model.type));
  if (saved.optimizer != model.optimizer)
    fail(path, "saved with optimizer '" + saved.optimizer + "', the strategy uses '" + model.optimizer +
                   "'; build the strategy with the optimizer the checkpoint was saved with");
  if (saved.tensors() != model.tensors())
    fail(path, "checkpoint has " + plural(saved.tensors(), "tensor") + ", the model " +
                   std::to_string(model.tensors()) + "; load it into the model it was saved from");
  if (saved.buffers != model.buffers || saved.counters != model.counters)
    fail(path, "checkpoint holds " + plural(saved.buffers, "optimizer buffer") + " and " +
                   plural(saved.counters, "step counter") + " per tensor, this optimizer " +
                   std::to_string(model.buffers) + " and " + std::to_string(model.counters));
  for (std::size_t t = 0; t < model.tensors(); ++t)
    for (std::size_t k = 0; k < per_tensor; ++k) {
      const std::size_t i = t * per_tensor + k;
      if (saved.lengths[i] != model.lengths[i])
        fail(path, "tensor " + std::to_string(t) + (k == 0 ? "" : " (optimizer buffer " + std::to_string(k - 1) + ")") +
                       " has " + plural(saved.lengths[i], "element") + " in the checkpoint, " +
                       std::to_string(model.lengths[i]) + " in the model; load it into the model it was saved from");
    }
  const ck::agent_layout model_agent = ck::agent_layout_of(strategy);
  if (saved_agent.present && !model_agent.present)
    fail(path, "holds the state of an aggregation, " + saved_agent.kind +
                   ", but this strategy's aggregation keeps none; load it into a strategy built as the one that saved it");
  if (!saved_agent.present && model_agent.present)
    fail(path, "holds no aggregation state, but this strategy's aggregation, " + model_agent.kind +
                   ", keeps some (a version 1 file: saved by a strategy without it, or by a gradwire that did not save "
                   "it); load a checkpoint this strategy saved");
  if (saved_agent.kind != model_agent.kind)
    fail(path, "saved by " + saved_agent.kind + ", this strategy's aggregation is " + model_agent.kind +
                   "; build the strategy with the settings the checkpoint was saved with");
  if (saved_agent.lengths.size() != model_agent.lengths.size() || saved_agent.counters != model_agent.counters)
    fail(path, "its aggregation state holds " + plural(saved_agent.lengths.size(), "buffer") + " and " +
                   plural(saved_agent.counters, "counter") + ", this strategy's " +
                   std::to_string(model_agent.lengths.size()) + " and " + std::to_string(model_agent.counters) +
                   "; load it into the model it was saved from");
  for (std::size_t k = 0; k < model_agent.lengths.size(); ++k)
    if (saved_agent.lengths[k] != model_agent.lengths[k])
      fail(path, "aggregation buffer " + std::to_string(k) + " has " + plural(saved_agent.lengths[k], "element") +
                     " in the checkpoint, " + std::to_string(model_agent.lengths[k]) +
                     " in the strategy; load it into the model it was saved from");

  // Read straight into the strategy's memory, checksumming again: only a file rewritten
  // between the two passes can fail here, and then the strategy is partly loaded.
  std::uint32_t again = support::crc32c(header_bytes);
  std::uint64_t at = header;
  auto read_into = [&](void* p, std::size_t n) {
    ck::read_at(f.get(), static_cast<std::byte*>(p), n, at, path);
    again = support::crc32c({static_cast<const std::byte*>(p), n}, again);
    at += n;
  };
  auto params = strategy.parameters();
  auto states = strategy.optimizer_states();
  for (std::size_t i = 0; i < params.size(); ++i) {
    read_into(params[i].data(), params[i].size() * sizeof(V));
    states[i].for_each_buffer([&](std::span<V> b) { read_into(b.data(), b.size_bytes()); });
    states[i].for_each_counter([&](long& c) {
      std::int64_t v = 0;
      read_into(&v, sizeof v);
      c = static_cast<long>(v);
    });
  }
  if constexpr (concepts::checkpoint_model_with_agent_state<Model>) {
    strategy.aggregation().for_each_checkpoint_buffer([&](std::span<V> b) { read_into(b.data(), b.size_bytes()); });
    strategy.aggregation().for_each_checkpoint_counter([&](std::uint64_t& c) { read_into(&c, sizeof c); });
  }
  if (again != crc)
    fail(path, "the file changed while it was being loaded; the strategy is partly loaded, load again");
  return step;
}

}  // namespace gradwire
