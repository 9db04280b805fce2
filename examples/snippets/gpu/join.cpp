// README.md's "On GPUs", host side: the TCP transport is built here (g++, gradwire::asio),
// because nvcc cannot compile Boost.Asio's headers, and handed to train.cu erased.
#include <gradwire/asio.hpp>
#include <gradwire/transport/any.hpp>

#include <type_traits>

namespace gw = gradwire;

static_assert(std::is_constructible_v<gw::transport::any_transport, gw::transport::asio_tcp>);

// [docs:join]
// join.cpp (g++, gradwire::asio)
gw::transport::any_transport join() {
  return gw::cluster::join_tcp();
}
// [/docs:join]
