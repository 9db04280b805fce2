// The explicit instantiations every transport's runtime makes: the collectives and the all-reduce agent for float and double.
//
// In compiled mode (config.hpp) a transport's instances header (inproc.hpp, asio_tcp.hpp,
// ucx.hpp beside this one) declares these `extern template` for its transport, so a
// translation unit does not instantiate, optimise and emit its own copy of the ring,
// halving-doubling, one-shot and hierarchical all-reduce, broadcast, the model check, the
// communicator and the all-reduce agent; the runtime's source (src/) defines them once. It
// roughly halves what a strategy's translation unit compiles (docs/building.md). The
// collectives' kernels are then the library's, compiled with the build's flags rather than a
// program's -march=native; they run at memory speed, and benchmarks/allreduce_tcp run
// interleaved against the header-only build is how to check that it costs nothing.
#pragma once

#include "../aggregation/all_reduce.hpp"
#include "../collective/all_reduce.hpp"
#include "../collective/broadcast.hpp"
#include "../collective/communicator.hpp"
#include "../collective/same_model.hpp"
#include "../config.hpp"

// PREFIX is `extern template` here and `template` in the runtime's source; one list for both.
#define GRADWIRE_COLLECTIVE_INSTANCES_OF(PREFIX, Tr, V)                                                       \
  PREFIX void collective::ring_all_reduce<Tr, V>(collective::communicator<Tr>&, std::span<V>, reduce_op);   \
  PREFIX void collective::halving_doubling_all_reduce<Tr, V>(collective::communicator<Tr>&, std::span<V>,   \
                                                             reduce_op);                                    \
  PREFIX void collective::one_shot_all_reduce<Tr, V>(collective::communicator<Tr>&, std::span<V>, reduce_op); \
  PREFIX void collective::hierarchical_all_reduce<Tr, V>(collective::communicator<Tr>&, std::span<V>,       \
                                                         reduce_op);                                        \
  PREFIX void collective::all_reduce<collective::auto_, Tr, V>(collective::communicator<Tr>&, std::span<V>, \
                                                               reduce_op);                                  \
  PREFIX void collective::broadcast<Tr, V>(collective::communicator<Tr>&, std::span<V>, int);               \
  PREFIX class aggregation::all_reduce_agent<collective::auto_, V, Tr>;

#define GRADWIRE_COLLECTIVE_INSTANCES(PREFIX, Tr)                                                  \
  PREFIX class collective::communicator<Tr>;                                                      \
  PREFIX void collective::check_same_model<Tr>(collective::communicator<Tr>&, dtype, std::span<const shape>); \
  GRADWIRE_COLLECTIVE_INSTANCES_OF(PREFIX, Tr, float)                                              \
  GRADWIRE_COLLECTIVE_INSTANCES_OF(PREFIX, Tr, double)
