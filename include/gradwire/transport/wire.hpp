// The frame format of byte-stream transports, named transport::wire where they use it.
//
// It lives in support/wire.hpp because the rendezvous store, below transport/, speaks it too.
#pragma once

#include "../support/wire.hpp"

namespace gradwire::transport {
namespace wire = support::wire;
}  // namespace gradwire::transport
