// Umbrella header of the gradwire::asio component: multi-process jobs over TCP.
//
// Cluster detection (torchrun, mpirun, Slurm, TF_CONFIG), the rendezvous store, the
// Boost.Asio TCP transport, and the strategies that run across processes. Needs Boost
// (headers) and nlohmann-json; link gradwire::asio.
#pragma once

#include "aggregation/all_reduce.hpp"
#include "cluster/spec.hpp"
#include "cluster/tcp.hpp"
#include "instances/asio_tcp.hpp"
#include "rendezvous/store.hpp"
#include "strategies.hpp"
#include "strategies/multi_worker_mirrored.hpp"
#include "strategy.hpp"
#include "tensor/host_tensor.hpp"
#include "transport/asio_tcp.hpp"
#include "transport/wire.hpp"
