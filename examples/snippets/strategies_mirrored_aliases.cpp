// docs/strategies/mirrored.md's aliases as the page states them, checked against gradwire's.
// Compiled only (they need every component but CUDA: <gradwire/ucx.hpp>).
#include <gradwire/gradwire.hpp>
#include <gradwire/ucx.hpp>

#include <type_traits>

namespace gradwire::docs {
// [docs:aliases]
template <class Tensor, class Optimizer>   // <gradwire/strategies/mirrored.hpp> (in gradwire.hpp)
using mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::inproc>;
template <class Tensor, class Optimizer>   // <gradwire/strategies/multi_worker_mirrored.hpp> (in asio.hpp), link gradwire::asio
using multi_worker_mirrored = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::asio_tcp>;
template <class Tensor, class Optimizer>   // <gradwire/ucx.hpp>, link gradwire::ucx
using multi_worker_mirrored_ucx = strategy<Tensor, Optimizer, aggregation::all_reduce, transport::ucx>;
// [/docs:aliases]
using T = tensor_view<float>;
using O = optim::adam;
static_assert(std::is_same_v<mirrored<T, O>, gradwire::mirrored<T, O>>);
static_assert(std::is_same_v<multi_worker_mirrored<T, O>, gradwire::multi_worker_mirrored<T, O>>);
static_assert(std::is_same_v<multi_worker_mirrored_ucx<T, O>, gradwire::multi_worker_mirrored_ucx<T, O>>);
}  // namespace gradwire::docs

int main() { return 0; }
