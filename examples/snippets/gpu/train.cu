// README.md's "On GPUs", device side (nvcc, gradwire::cuda): mirrored on two threads of one
// GPU (`snippet_gpu threads`), and replicas in processes over a transport that join.cpp
// built (`gradwire-run -n 2 -- snippet_gpu processes`). Without a CUDA device it exits 77.
//
// The model runs on the host (snippet_support.hpp) and crosses to the device through
// blocking copies; what is checked is the strategy: the parameters each replica sees
// before each step follow one device in float64 on the global batches.
#include <gradwire/cuda.cuh>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "snippet_support.hpp"

namespace gw = gradwire;
using snippets::Model;

namespace {

unsigned seed = 0;
int replicas = 2;
std::vector<snippets::batch> global;

std::vector<snippets::batch> my_shard_of_the_data(int rank) { return snippets::shard(Model::shape, global, rank, replicas); }

std::vector<gw::cuda_tensor<float>> my_model_parameters(cudaStream_t stream) {
  const auto wb = Model::initial_values(seed);
  const std::vector<float> w(wb.begin(), wb.begin() + std::ptrdiff_t(Model::shape.weights()));
  const std::vector<float> b(wb.begin() + std::ptrdiff_t(Model::shape.weights()), wb.end());
  std::vector<gw::cuda_tensor<float>> params;
  params.emplace_back(gw::shape{Model::shape.outputs, Model::shape.inputs}, std::span<const float>(w), stream);
  params.emplace_back(gw::shape{Model::shape.outputs}, std::span<const float>(b), stream);
  return params;
}

// What each replica saw, and its gradient tensors (on the legacy default stream, filled by
// blocking copies: ready before the strategy reads them on the parameters' stream).
struct replica {
  std::vector<std::vector<float>> seen;  // the parameters before each step
  std::vector<gw::cuda_tensor<float>> grads;
};
std::mutex replicas_mutex;
std::vector<std::unique_ptr<replica>> seen_by_replicas;
thread_local replica* this_replica = nullptr;

std::vector<gw::cuda_tensor<float>>& my_forward_backward(std::span<gw::cuda_tensor<float>> params,
                                                         const snippets::batch& d, cudaStream_t) {
  if (!this_replica) {
    const std::lock_guard<std::mutex> lock(replicas_mutex);
    this_replica = seen_by_replicas.emplace_back(std::make_unique<replica>()).get();
    this_replica->grads.emplace_back(params[0].shape());
    this_replica->grads.emplace_back(params[1].shape());
  }
  std::vector<float> wb(Model::shape.parameters());
  params[0].copy_to_host(std::span<float>(wb).first(Model::shape.weights()));
  params[1].copy_to_host(std::span<float>(wb).subspan(Model::shape.weights()));
  this_replica->seen.push_back(wb);
  const auto g = snippets::gradient(Model::shape, std::span<const float>(wb), d);
  const std::vector<float> gf(g.begin(), g.end());
  this_replica->grads[0].copy_from_host(std::span<const float>(gf).first(Model::shape.weights()));
  this_replica->grads[1].copy_from_host(std::span<const float>(gf).subspan(Model::shape.weights()));
  return this_replica->grads;
}

}  // namespace

// [docs:train]
// train.cu (nvcc, gradwire::cuda)
gw::transport::any_transport join();   // defined in join.cpp

void train(std::vector<gw::cuda_tensor<float>> params, cudaStream_t stream) {
  gw::strategy<gw::cuda_tensor<float>, gw::optim::adam, gw::aggregation::all_reduce, gw::transport::any_transport>
      strategy(join(), std::move(params));
  for (auto& batch : my_shard_of_the_data(strategy.rank()))
    strategy.step(my_forward_backward(strategy.parameters(), batch, stream));
}
// [/docs:train]

void threads() {
  // [docs:on_gpus]
  #include <gradwire/cuda.cuh>   // in a .cu file (nvcc); link gradwire::cuda

  gw::transport::run_inproc(2, [&](gw::transport::inproc endpoint) {
    gw::cuda::stream stream;                                    // this replica's stream
    std::vector<gw::cuda_tensor<float>> params = my_model_parameters(stream);
    gw::mirrored<gw::cuda_tensor<float>, gw::optim::adam> strategy(endpoint, std::move(params));
    for (auto& batch : my_shard_of_the_data(endpoint.rank())) {
      auto& grads = my_forward_backward(strategy.parameters(), batch, stream);  // cuda_tensors, on `stream`
      strategy.step(grads);
    }
  });
  // [/docs:on_gpus]
}

int main(int argc, char** argv) {
  if (gw::cuda::device_count() == 0) {
    std::fprintf(stderr, "snippet_gpu: no CUDA device (or no driver) here: skipped\n");
    return 77;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool processes = mode == "processes";
  seed = processes ? snippets::job_seed() : 20240611u;
  if (processes) {
    const char* world = std::getenv("WORLD_SIZE");
    replicas = world ? std::atoi(world) : 1;
  }
  global = snippets::make_batches(Model::shape, 8, 4 * std::size_t(replicas), seed + 1);
  if (processes) {
    gw::cuda::stream stream;
    train(my_model_parameters(stream), stream);
  } else if (mode == "threads") {
    threads();
  } else {
    snippets::expect("usage: snippet_gpu threads|processes", false);
  }

  // The parameters before step k are one device's (float64) after k steps on the global batches.
  std::vector<double> p = Model::initial_values(seed);
  snippets::reference_adam adam(1e-3);
  std::vector<std::vector<double>> want;
  for (const auto& d : global) {
    want.push_back(p);
    adam.step(p, snippets::gradient(Model::shape, std::span<const double>(p), d));
  }
  snippets::expect("every replica trained", seen_by_replicas.size() == (processes ? 1u : std::size_t(replicas)));
  for (const auto& r : seen_by_replicas) {
    snippets::expect("a step per batch", r->seen.size() == want.size());
    for (std::size_t k = 0; k < r->seen.size() && k < want.size(); ++k)
      snippets::expect_close("parameters before step " + std::to_string(k), std::span<const float>(r->seen[k]),
                             std::span<const double>(want[k]), 1e-4);
  }
  seen_by_replicas.clear();  // frees the gradient tensors while the runtime is up
  return snippets::report(("snippet_gpu " + mode).c_str(), seed);
}
