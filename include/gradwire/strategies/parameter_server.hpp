// parameter_server<Tensor, Optimizer, Mode, Transport>: ParameterServerStrategy, strategy<> over ps/.
#pragma once

#include "../aggregation/parameter_server.hpp"
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// ParameterServerStrategy: variables sharded over the last ps::options::servers ranks;
// Mode is ps::sync, ps::async, ps::bounded_staleness<s> or ps::backup_workers<b>; Codec
// compresses the workers' pushes (aggregation::parameter_server::compress; include the
// codec's header from gradwire/compress/).
template <class Tensor, class Optimizer, class Mode, class Transport = transport::inproc,
          class Codec = aggregation::no_codec>
using parameter_server = strategy<Tensor, Optimizer, aggregation::parameter_server<Mode, Codec>, Transport>;

}  // namespace gradwire
