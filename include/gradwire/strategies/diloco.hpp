// diloco<Tensor, Optimizer, H, Transport>: DiLoCo (local steps, an outer Nesterov step every H), strategy<> with averaging<H, optim::momentum>.
#pragma once

#include "../aggregation/diloco.hpp"
#include "../strategy.hpp"
#include "../transport/inproc.hpp"

namespace gradwire {

// DiLoCo: each replica takes H inner steps with Optimizer (AdamW in the paper), then the
// replicas' mean pseudo-gradient (anchor - parameters) steps the anchor with an outer
// Nesterov momentum (lr 0.7, momentum 0.9 by default) and every replica goes on from it.
// Build the aggregation with aggregation::diloco<H>(options) or diloco(period, options);
// options.fragments / delay stream it (aggregation/averaging.hpp); Codec compresses the
// pseudo-gradients (aggregation::diloco(period, options, codec)).
template <class Tensor, class Optimizer, int H, class Transport = transport::inproc, class Codec = aggregation::no_codec>
using diloco = strategy<Tensor, Optimizer, aggregation::diloco_averaging<H, Codec>, Transport>;

}  // namespace gradwire
