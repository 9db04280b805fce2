// The host side of --device cuda (builds with gradwire::cuda): the initial parameters and the
// data set for train_cuda.cu, and over tcp or ucx the transport it trains through, erased.
#include <cstddef>

#include <gradwire/transport/any.hpp>
#if GRADWIRE_HAS_ASIO
#include <gradwire/asio.hpp>
#endif
#if GRADWIRE_HAS_UCX
#include <gradwire/ucx.hpp>
#endif

#include "cuda_training.hpp"
#include "mlp.hpp"
#include "training.hpp"

// train_cuda.cu sees no Eigen: it gets the host model's initial parameters (same seed) and the data as arrays.
fashion_mnist::summary fashion_mnist::train_on_gpu(const options& o, const data_set& data) {
  cuda_run run;
  run.strategy = o.strategy;
  run.optimizer = o.optimizer;
  run.replicas = o.replicas;
  run.owner = o.owner.value_or(0);
  run.epochs = o.epochs;
  run.batch = o.batch;
  run.lr = *o.lr;
  run.cosine = o.schedule == "cosine";
  run.seed = o.seed;
  run.target_accuracy = o.target_accuracy;
  run.pixels = static_cast<std::size_t>(data.train.images.rows());
  run.train_count = data.train.size();
  run.test_count = data.test.size();
  run.train_images = data.train.images.data();
  run.train_labels = data.train.labels.data();
  run.test_images = data.test.images.data();
  run.test_labels = data.test.labels.data();
  mlp<float> model({}, o.seed);
  for (const auto& p : model.parameter_views()) {
    run.initial.emplace_back(p.data(), p.data() + p.size());
    const auto [rows, cols] = mlp<float>::eigen_extents(p.shape());
    run.rows.push_back(rows);
    run.cols.push_back(cols);
    run.shapes.push_back(p.shape());
  }
  if (uses_tcp(o)) {  // one replica per process: the transport is built here and handed over erased
#if GRADWIRE_HAS_ASIO
    run.local_rank = gradwire::cluster::detect().local_rank;
    run.join = [&o]() -> gradwire::transport::any_transport {
      if (o.transport == "ucx") {
#if GRADWIRE_HAS_UCX
        return gradwire::cluster::join_ucx();
#else
        throw usage_error("--transport ucx: this build has no UCX (gradwire::ucx; Debian: libucx-dev)");
#endif
      }
      return gradwire::cluster::join_tcp();
    };
#endif
  }
  summary out;
  const auto r = train_on_cuda(run);
  out.chief = r.chief;
  out.final_accuracy = r.final_accuracy;
  out.total_seconds = r.total_seconds;
  out.epoch_reached = r.epoch_reached;
  out.seconds_reached = r.seconds_reached;
  return out;
}
