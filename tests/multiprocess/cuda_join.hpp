// How mp_cuda_worker (nvcc) gets its transport: built in a host TU (cuda_join.cpp, g++),
// because nvcc cannot compile Boost.Asio's headers. Nothing here needs Asio or CUDA.
#pragma once

#include <gradwire/transport/any.hpp>

namespace gradwire::test {

struct joined_job {
  transport::any_transport transport;
  int servers = 0;  // parameter-server ranks (gradwire-run --ps S), the last ranks of the job
};

// Joins the job the environment describes over TCP (cluster::join_tcp).
joined_job join_tcp_erased();

}  // namespace gradwire::test
