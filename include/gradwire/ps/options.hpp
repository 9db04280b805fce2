// The settings of a parameter-server job (ps::options): servers, sharding, learning rate, checkpoints, deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>

#include "../timeouts.hpp"

namespace gradwire::ps {

// A learning-rate schedule run by the servers, which own the optimizer: before each
// update, lr = schedule(version, gradients applied so far).
using learning_rate_schedule = std::function<double(std::uint64_t version, std::uint64_t applied)>;

struct options {
  int servers = 1;  // the last `servers` ranks serve (the last 2 * servers with standbys)
  // Failover: each server has a standby rank that applies every update its server applies
  // and takes the shard over when the server is lost, without a restart (ps/replica.hpp).
  // Ranks: workers, then the servers, then their standbys in the same order. Needs a
  // transport that survives a lost peer (asio_tcp, ucx).
  bool standby = false;
  // Async modes: how many updates a standby may trail its server by; a server that gets
  // that far ahead waits for its standby. Those updates (at most this many) and each
  // worker's push in flight are what a failover loses. Sync modes lose none: a step's
  // pulls are answered only once the standby has its update.
  std::uint32_t standby_lag = 8;
  // Tensors larger than this are split over the servers (TensorFlow's partitioners
  // default to a 256 KiB minimum slice).
  std::size_t split_bytes = std::size_t{256} << 10;
  // Async modes: scale each gradient by 1 / max(1, update lag) (Zhang et al. 2016). That
  // divides the step of SGD and momentum; Adam and AdamW normalise it away.
  bool staleness_aware_lr = false;
  // A learning-rate schedule the servers run (learning_rate_schedule); needs an optimizer
  // with set_lr(double), checked when a server starts: a run-time error, since these
  // options do not know the optimizer. strategy<>::serve(schedule) takes one where the
  // optimizer's type is known, so that one without set_lr is a compile error. Empty: the
  // optimizer's lr throughout (or serve(schedule)'s).
  learning_rate_schedule learning_rate;
  // Servers write their shards here every checkpoint_every steps (0: only at exit) and
  // at exit; at start they resume from the files found there. Empty: no checkpoints.
  std::filesystem::path checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  // How long a server waits for any worker message, and a worker for a server's answer.
  std::chrono::milliseconds timeout = default_timeout;
  // A lost worker is reported as a warning (observe::log_warning, written whatever
  // GRADWIRE_LOG says) by the chief and by each server that drops it; false: only at
  // GRADWIRE_LOG=info.
  bool report = true;

  // The ranks that serve: the servers and their standbys (the last of the job's ranks).
  int serving_ranks() const noexcept { return standby ? 2 * servers : servers; }
};

}  // namespace gradwire::ps
