// Every named strategy of the core component (one_device, mirrored, central_storage, local_sgd, parameter_server, sharded).
//
// Each alias also has its own header, gradwire/strategies/NAME.hpp, which includes only
// its aggregation and transport: a translation unit that names one strategy compiles
// that one. multi_worker_mirrored (TCP) is in <gradwire/strategies/multi_worker_mirrored.hpp>
// (component gradwire::asio), its UCX and MPI variants in <gradwire/ucx.hpp> and <gradwire/mpi.hpp>.
#pragma once

#include "strategies/central_storage.hpp"
#include "strategies/diloco.hpp"
#include "strategies/local_sgd.hpp"
#include "strategies/mirrored.hpp"
#include "strategies/one_device.hpp"
#include "strategies/parameter_server.hpp"
#include "strategies/sharded.hpp"
