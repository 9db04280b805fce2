// Every named strategy is the strategy<> its header documents (tensor, optimizer,
// aggregation, transport in that order), and a type a user can instantiate: compiled by
// the ctest "headers: every named strategy ..." (includes_only.cmake), which fails on any
// static_assert below or in strategy<>'s own checks.
#include <gradwire/optim/momentum.hpp>
#include <gradwire/strategies.hpp>
#include <gradwire/tensor/host_tensor.hpp>
#if GRADWIRE_TEST_ASIO
#include <gradwire/strategies/multi_worker_mirrored.hpp>
#endif
#if GRADWIRE_TEST_MPI
#include <gradwire/mpi.hpp>
#endif
#if GRADWIRE_TEST_UCX
#include <gradwire/ucx.hpp>
#endif
#include <type_traits>

namespace gw = gradwire;
using T = gw::host_tensor<double>;
using O = gw::optim::momentum;

// sizeof instantiates the class: the aggregation, optimizer and transport concepts are checked.
template <class Named, class Aggregation, class Transport>
constexpr bool is_strategy_of = std::is_same_v<Named, gw::strategy<T, O, Aggregation, Transport>> && sizeof(Named) > 0;

static_assert(is_strategy_of<gw::one_device<T, O>, gw::aggregation::local, gw::transport::local>);
static_assert(is_strategy_of<gw::mirrored<T, O>, gw::aggregation::all_reduce, gw::transport::inproc>);
static_assert(is_strategy_of<gw::central_storage<T, O>, gw::aggregation::central, gw::transport::inproc>);
static_assert(is_strategy_of<gw::local_sgd<T, O, 4>, gw::aggregation::averaging<4>, gw::transport::inproc>);
static_assert(is_strategy_of<gw::parameter_server<T, O, gw::ps::sync>, gw::aggregation::parameter_server<gw::ps::sync>,
                             gw::transport::inproc>);
static_assert(is_strategy_of<gw::sharded<T, O>, gw::aggregation::sharded, gw::transport::inproc>);
static_assert(is_strategy_of<gw::diloco<T, O, 4>, gw::aggregation::averaging<4, gw::optim::momentum>, gw::transport::inproc>);
#if GRADWIRE_TEST_ASIO
static_assert(is_strategy_of<gw::multi_worker_mirrored<T, O>, gw::aggregation::all_reduce, gw::transport::asio_tcp>);
#endif
#if GRADWIRE_TEST_MPI
static_assert(is_strategy_of<gw::multi_worker_mirrored_mpi<T, O>, gw::aggregation::all_reduce, gw::transport::mpi>);
#endif
#if GRADWIRE_TEST_UCX
static_assert(is_strategy_of<gw::multi_worker_mirrored_ucx<T, O>, gw::aggregation::all_reduce, gw::transport::ucx>);
#endif
