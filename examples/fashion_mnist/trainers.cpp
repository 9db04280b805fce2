// fashion_mnist's trainers: every strategy family on every transport this build has, and the GPU's.
#include <stdexcept>
#include <string>
#include <string_view>

#include "training.hpp"

fashion_mnist::trainer fashion_mnist::find_trainer(const options& o) {
  struct entry {
    std::string_view strategy, transport;
    trainer train;
  };
#if GRADWIRE_HAS_CUDA
  if (o.device == "cuda") return train_on_gpu;
#endif
  static constexpr entry trainers[] = {
      {"one_device", "inproc", train_one_device},
      {"mirrored", "inproc", train_all_reduce_inproc},
      {"mirrored", "simulated", train_all_reduce_simulated},
      {"multi_worker_mirrored", "simulated", train_all_reduce_simulated},
      {"mirrored elastic", "simulated", train_elastic_simulated},
      {"multi_worker_mirrored elastic", "simulated", train_elastic_simulated},
      {"central_storage", "inproc", train_central_inproc},
      {"central_storage", "simulated", train_central_simulated},
      {"local_sgd", "inproc", train_local_sgd_inproc},
      {"local_sgd", "simulated", train_local_sgd_simulated},
      {"diloco", "inproc", train_diloco_inproc},
      {"diloco", "simulated", train_diloco_simulated},
      {"sharded", "inproc", train_sharded_inproc},
      {"sharded", "simulated", train_sharded_simulated},
      {"mirrored compressed", "inproc", train_compressed_inproc},
      {"mirrored compressed", "simulated", train_compressed_simulated},
      {"multi_worker_mirrored compressed", "simulated", train_compressed_simulated},
      {"parameter_server sync", "inproc", train_ps_sync_inproc},
      {"parameter_server bounded", "inproc", train_ps_bounded_inproc},
      {"parameter_server backup", "inproc", train_ps_backup_inproc},
      {"parameter_server many_backup", "inproc", train_ps_many_backup_inproc},
      {"parameter_server sync", "simulated", train_ps_sync_simulated},
      {"parameter_server bounded", "simulated", train_ps_bounded_simulated},
      {"parameter_server backup", "simulated", train_ps_backup_simulated},
      {"parameter_server many_backup", "simulated", train_ps_many_backup_simulated},
      {"parameter_server sync compressed", "inproc", train_ps_compressed_inproc},
      {"parameter_server sync compressed", "simulated", train_ps_compressed_simulated},
#if GRADWIRE_HAS_ASIO
      {"multi_worker_mirrored", "tcp", train_all_reduce_tcp},
      {"multi_worker_mirrored elastic", "tcp", train_elastic_tcp},
      {"central_storage", "tcp", train_central_tcp},
      {"local_sgd", "tcp", train_local_sgd_tcp},
      {"diloco", "tcp", train_diloco_tcp},
      {"sharded", "tcp", train_sharded_tcp},
      {"multi_worker_mirrored compressed", "tcp", train_compressed_tcp},
      {"parameter_server sync", "tcp", train_ps_sync_tcp},
      {"parameter_server bounded", "tcp", train_ps_bounded_tcp},
      {"parameter_server backup", "tcp", train_ps_backup_tcp},
      {"parameter_server many_backup", "tcp", train_ps_many_backup_tcp},
      {"parameter_server sync compressed", "tcp", train_ps_compressed_tcp},
#endif
#if GRADWIRE_HAS_UCX
      {"multi_worker_mirrored", "ucx", train_all_reduce_ucx},
      {"multi_worker_mirrored elastic", "ucx", train_elastic_ucx},
      {"central_storage", "ucx", train_central_ucx},
      {"local_sgd", "ucx", train_local_sgd_ucx},
      {"parameter_server sync", "ucx", train_ps_sync_ucx},
      {"parameter_server bounded", "ucx", train_ps_bounded_ucx},
      {"parameter_server backup", "ucx", train_ps_backup_ucx},
      {"parameter_server many_backup", "ucx", train_ps_many_backup_ucx},
      {"parameter_server sync compressed", "ucx", train_ps_compressed_ucx},
#endif
  };
  // parameter_server's trainers are split by --ps-mode (family_ps.hpp): sync and async,
  // bounded:1|2|4, backup:1|2, backup:4|8.
  std::string strategy = o.strategy;
  if (strategy == "parameter_server") {
    const std::string& mode = o.ps_mode;
    strategy += mode.starts_with("bounded")                  ? " bounded"
                : mode == "backup:1" || mode == "backup:2" ? " backup"
                : mode.starts_with("backup")               ? " many_backup"
                                                           : " sync";
  }
  if (o.min_replicas > 0) strategy += " elastic";
  // diloco takes its codec inside its own trainer (family_diloco.hpp).
  if (o.compress != "none" && strategy != "diloco") strategy += " compressed";
  for (const entry& e : trainers)
    if (e.strategy == strategy && e.transport == o.transport) return e.train;
  // parse() and process_rank() have refused what this build lacks.
  throw std::logic_error("fashion_mnist has no trainer for --strategy " + o.strategy + " over " + o.transport);
}
