// The host half of mp_cuda_worker: joins over Boost.Asio TCP and hands the transport over erased.
#include "cuda_join.hpp"

#include <gradwire/asio.hpp>
#include <type_traits>

namespace gradwire::test {

// What crosses to the nvcc side: the TCP transport, erased.
static_assert(std::is_constructible_v<transport::any_transport, transport::asio_tcp>);

joined_job join_tcp_erased() {
  const auto spec = cluster::detect();
  return {cluster::join_tcp(), spec.count(cluster::task_type::ps)};
}

}  // namespace gradwire::test
