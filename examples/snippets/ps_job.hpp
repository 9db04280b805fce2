// What the parameter-server snippets share: this rank's part of the job, its data, and the checks.
//
// Apart from snippet_support.hpp because it reads the cluster spec, which needs gradwire::asio's
// JSON (TF_CONFIG); the programs that include it link gradwire::asio.
#pragma once

#include <gradwire/cluster/spec.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "snippet_support.hpp"

namespace snippets {

// A job launched with --ps: the last `servers` ranks serve, the others are workers. Parameter
// servers train asynchronously, so there is nothing to compare bit for bit: a worker checks
// that training lowered the loss on its data, and a server that it wrote its shard's
// checkpoint under ckpt/.
class ps_job {
 public:
  static constexpr std::uint64_t budget = 60;  // updates the servers apply before the workers stop

  // Construct it before joining the job: rank 0 removes ckpt/, since a fresh job has no
  // checkpoint of an earlier run to resume from.
  explicit ps_job(unsigned seed)
      : spec_(gradwire::cluster::detect()),
        servers_(spec_.count(gradwire::cluster::task_type::ps)),
        workers_(spec_.world_size - servers_),
        // This worker's shard of 8 global batches of 4 rows a worker (a server holds the last worker's).
        data_(shard(Model::shape, make_batches(Model::shape, 8, 4 * std::size_t(workers_), seed + 1),
                    std::min(spec_.rank, workers_ - 1), workers_)),
        // The loss where Model(seed) starts (its float values, widened to double).
        before_(loss(Model::shape, std::span<const double>(Model::initial_values(seed)), data_)) {
    if (spec_.rank == 0) {
      std::error_code ignored;
      std::filesystem::remove_all("ckpt", ignored);
    }
  }

  // The worker's batches, round and round.
  const batch& next_batch() { return data_[next_++ % data_.size()]; }

  // A worker, once its loop has ended: the servers had applied the budget, and `how` (the
  // training it did) lowered the loss of `model` on its data.
  void expect_worker_trained(const std::string& how, const Model& model, std::uint64_t applied) const {
    expect("the worker's loop ended once the servers had applied the budget", applied >= budget);
    const double after = loss(Model::shape, std::span<const float>(model.values()), data_);
    expect(how + " lowered the worker's loss (" + std::to_string(before_) + " -> " + std::to_string(after) + ")",
           after < before_);
  }

  // A server: it wrote its shard's checkpoint (`when`, for the message: "at exit", or "").
  void expect_checkpoint_written(const std::string& when) const {
    const int shard = spec_.rank - (spec_.world_size - servers_);
    const auto file = "ckpt/ps-shard-" + std::to_string(shard) + "-of-" + std::to_string(servers_) + ".ckpt";
    expect("the server wrote " + file + (when.empty() ? "" : " " + when), std::filesystem::exists(file));
  }

 private:
  gradwire::cluster::cluster_spec spec_;
  int servers_, workers_;
  std::vector<batch> data_;
  double before_;
  std::size_t next_ = 0;
};

}  // namespace snippets
